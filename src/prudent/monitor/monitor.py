"""Monitor: the component that runs the rules on the loop's statistics and acts on findings.

On the hot path (``after_backward``, ``step_end``) it only keeps device references; every
``check_every_steps`` steps, at each ``run.log`` and at the end, it reads them into a
:class:`Window` and asks every rule. A rule that fires is announced (event, stderr line,
webhook) and its actions run. The ``stalled`` rule is judged by a watchdog thread instead.

Three things happen outside that cycle: once the run's planned length is known the rules are
sized to it (``Rule.fit``; a rule that cannot judge so short a run says so once); with
``loss_spike``'s ``skip`` action and the loss on the host, each step's loss is judged before
the optimizer's update (the update of an outlier is skipped); and early stopping's best
evaluation is kept as a checkpoint, put back when it stops the run.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from prudent.kernel.errors import StopRun
from prudent.kernel.events import Component, Event, EventKind
from prudent.kernel.optimizer_step import put_back_step, replace_next_step
from prudent.kernel.step_values import StepValues
from prudent.kernel.stop import StopReason
from prudent.launch.spec import LaunchSpec, host_name
from prudent.monitor.actions import Action, Firing, RollbackAction, build_actions
from prudent.monitor.base import (
    START_STEPS,
    EvalSample,
    Finding,
    Rule,
    Window,
    fmt,
    validation_metric,
)
from prudent.monitor.registry import RULES
from prudent.monitor.settings import MonitorSettings
from prudent.monitor.stall_stacks import PEER_WAIT_S, RankStacks
from prudent.monitor.stats import StepStats, on_grid, saved_loss
from prudent.monitor.watchdog import StallWatchdog
from prudent.monitor.webhook import WebhookSender

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["Monitor", "build_rules"]

_SAMPLED = frozenset({"layers", "activations"})
_WAKE_SIGNAL = getattr(signal, "SIGUSR2", None)


def build_rules(settings: MonitorSettings) -> dict[str, Rule]:
    """One instance of every enabled registered rule, with its settings."""
    chosen = settings.rule_settings()
    return {name: RULES[name](rule_settings) for name, rule_settings in chosen.items()
            if rule_settings.enabled}


class Monitor(Component):
    name = "monitor"

    def __init__(self, settings: MonitorSettings | None = None, stream: TextIO | None = None,
                 quiet: bool = False) -> None:
        self.settings = settings or MonitorSettings()
        self.rules = build_rules(self.settings)
        self.stats = StepStats(self.settings)
        self._set_check_grid()
        self._watched: dict[int, Any] = {}  # every object an ATTACH showed (adapters' too)
        self.actions: dict[str, Action] = build_actions(self.settings.actions, self._watched)
        self.firings: list[Firing] = []
        self.stream = stream
        self.quiet = quiet
        self._muted_until: dict[str, int] = {}
        # the finite losses since the last log: their sum, count and sum of squares
        self._train_loss = [0.0, 0, 0.0]
        self.start_loss: float | None = None  # see Window.start_loss
        self._start_values: list[float] = []
        self._watchdog: StallWatchdog | None = None
        self._webhook: WebhookSender | None = None
        self._previous_handler: Any = None
        self._wake_installed = False
        self._interrupting = False
        self._num_logs = 0
        self._loss_key = self.settings.loss_key
        self._fitted_for: int | None = None  # the planned length the rules were sized to
        self._said_blind: set[str] = set()
        self._skipped: list[Any] = []  # optimizers whose next step is a no-op
        self._repaired: list[int] = []  # steps whose update was skipped, not yet checked
        self.best_checkpoint: str | None = None  # early stopping's best evaluation
        # the metrics judged at the newest evaluation's step: a run resumed from a checkpoint
        # taken inside run.log (early stopping's keep) logs that evaluation again, and judging
        # it twice would count it twice (patience, the number of evaluations)
        self._judged_evals: tuple[int, list[str]] = (-1, [])
        spike = self.rules.get("loss_spike")
        self._skipper = spike if spike is not None and "skip" in spike.settings.action else None
        # exploding_gradient's skip: a norm far above its median, judged before the update on
        # the grid steps (measured whatever the timing) and on a step whose loss jumped
        grad = self.rules.get("exploding_gradient")
        self._norm_skipper: Any = grad if grad is not None and "skip" in grad.settings.action \
            else None
        self._norm_judged = -1  # the step whose loss jumped: its norm is judged too
        self._tail_said: set[str] = set()  # rules whose trained outlier was recorded
        self._tail_trained: list[int] = []  # steps trained as the tail's, not yet checked
        self._norm_bar = math.inf  # a loss above it has its step's norm judged
        self._watch_all = True  # started or restored: the next loss is looked at whatever it is
        if self._norm_skipper is not None:
            self.stats.measure_grid()
        # under torchrun: prudent's gloo group, over which the ranks agree on each skip (one
        # rank skipping an update alone would leave the replicas apart for good)
        self._agree: Any = None
        self._vote: tuple[int, float, float, Any] | None = None  # step, loss, mine, in flight
        self._watched_above: float | None = None  # the threshold the kernel's loss watch has
        self._device_loss_seen = False  # a loss on a device: nothing to watch on the host
        self._check_now = False  # the watch saw a non-finite loss: a check at this step's end
        self._kept: StepValues | None = None  # each step's loss, kept by the kernel
        self._verdict_due: int | None = None  # a check a rule asked for (see _ask_verdicts)
        self._sample_every: int | None = None  # the interval a sooner sample replaced
        self._last_sample: int | None = None
        self._prune_early_stopping_in_trials()

    def _prune_early_stopping_in_trials(self) -> None:
        """In a tuning trial, early stopping prunes (exit 5, never resumed) where it would stop."""
        rule = self.rules.get("early_stopping")
        if rule is None or "stop" not in rule.settings.action:
            return
        try:
            trial = LaunchSpec.from_env().trial
        except Exception:  # noqa: BLE001 - a malformed trial spec is the tuner's to report
            trial = None
        if trial is not None:
            rule.settings = rule.settings.model_copy(update={
                "action": ["prune" if a == "stop" else a for a in rule.settings.action]})

    # events -------------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        url = self.settings.actions.alert.url()
        if url:
            self._webhook = WebhookSender(url, self.settings.actions.alert.timeout_s,
                                          on_error=lambda m: run.record_event(EventKind.MONITOR,
                                                                              "webhook_failed", m))
        if "stalled" in self.rules:
            self._start_watchdog(run)
        if run.world_size > 1 and self._norm_skipper is not None:
            self._no_norm_skip(run, "each rank would judge its own loss jumps")
        if run.world_size > 1 and run.rank_group is not None and self._skipper is not None:
            self._agree = run.rank_group
            # each rank's vote is posted as the loss is known, before the backward pass (a
            # handler added only here: a single process pays no call per step for it)
            run.handlers[Event.BEFORE_BACKWARD].append(self._post_vote)
        self._kept = run.keep_step_values(self, self._loss_key)
        self._watch_losses(run)  # before the thresholds are known too: a NaN, a device loss
        if any("rollback" in rule.settings.action for rule in self.rules.values()):
            rollback = self._rollback()
            rollback.state = run.state  # a skip restored from a checkpoint counts its batches
            run.wrap_batches(rollback.batches)  # a rollback skips batches

    def _agreeing(self) -> bool:
        """Skips are decided by every rank together (torchrun, torch.distributed ready)."""
        return self._skipper is not None and self._agree is not None and self._agree.ready

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        self.stats.attach(objects)
        self._watched.update((id(o), o) for o in objects.values())

    def _loss_watched(self, run: RunContext, loss: Any, value: Any) -> None:
        """The kernel's loss watch, before the step's backward: a host loss that is not finite
        (checked at this step's end), far above the last window's mean (this step's gradient
        norm is measured), above loss_spike's skip threshold (judged for a skip), or a loss on
        a device. Every other step costs the kernel one comparison and this component nothing:
        it sleeps through them (see :meth:`_sleep`)."""
        if value.__class__ is not float:  # on a device: judged for a skip only if allowed
            if self._skipper is not None:
                self._judge_value(run, value)
            if self._skipper is None:
                self._device_loss_seen = True
                self._watch_losses(run)  # a watch that would call us on every step: off
            return
        if value - value != 0.0:  # NaN or infinite
            self._check_now = True
            run.wake(self)
        elif value > self.stats.loss_jump_at or value > self._norm_bar:
            self.stats.look_closer(run.state.step)  # this step's gradient norm is measured
            if value > self._norm_bar:  # and judged for exploding_gradient's skip
                self._norm_judged = run.state.step + 1
            run.wake(self, Event.AFTER_BACKWARD)
        self._judge_value(run, value)

    def _watch_losses(self, run: RunContext) -> None:
        """Keep the kernel's loss watch at the lowest bar it must look above (loss_spike's skip
        threshold moves at each check, the loss jump at each window); none once the loss is
        seen on a device with no skip to judge (a device loss the user would not wait for)."""
        skipper = self._skipper
        if self._device_loss_seen and skipper is None:
            above = None
        elif self._watch_all:
            above = -math.inf  # started (or restored) now: the first step's loss is looked at
        else:
            above = min(self.stats.loss_jump_at, self._norm_bar)
            if skipper is not None:
                above = min(above, skipper.watch_above)
        if above != self._watched_above:
            self._watched_above = above
            run.watch_loss(self, None if above is None else self._loss_watched,
                           above if above is not None else math.inf)

    def _judge_loss(self, run: RunContext, loss: Any) -> None:
        self._judge_value(run, run.host_scalar(loss))

    def _judge_value(self, run: RunContext, value: Any) -> None:
        """The step's loss (a host number, or a tensor on a device) before its update."""
        skipper = self._skipper
        if skipper is None or self._agreeing():  # then judged after backward, by every rank
            return
        step = run.state.step + 1
        if value.__class__ is not float:
            self._judge_device_loss(run, step, value)
        elif value > skipper.watch_above:  # an outlier, maybe (NaN compares False)
            self._judge_update(run, step, value)

    def on_after_backward(self, run: RunContext, loss: Any) -> None:
        step = run.state.step + 1
        agreeing = self._agreeing()
        judging = self._skipper is not None and (agreeing or run.loss_watched_step != step)
        if agreeing:
            self._judge_agreed(run, step, loss)  # every step, on every rank alike
        elif judging:
            # a loop that announces its loss after backward only (an adapter of one's own
            # that calls after_backward, not before_backward): judged here, and this hook
            # stays on every step
            self._judge_loss(run, loss)
        stats = self.stats
        if step >= stats.backward_due:
            bursting = stats.bursting
            stats.after_backward(step)
            if self._norm_skipper is not None:
                self._judge_norm(run, step, loss)
            if stats.bursting and not bursting:
                run.wake(self)  # a jump in the norm: the rules look sooner while it lasts
            elif stats.sampled_at(step):
                run.wake(self)  # a sample its end finishes (sharded: on every rank's end)
        if not judging:
            run.sleep_until(self, stats.backward_due, Event.AFTER_BACKWARD)

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        """A step whose end needs a look (a check, a sample, a loss the watch flagged), with the
        steps slept through before it; every step when the kernel's loss watch does not see
        the loop's host losses."""
        stats = self.stats
        if self._skipped:
            self._unskip()  # the loop never called optimizer.step() (a GradScaler's inf)
        step = run.state.step
        steps, losses = self._kept.take() if self._kept is not None else ([], [])
        if not steps or steps[-1] != step:  # the kernel kept nothing for us (paused until now)
            steps, losses = steps + [step], losses + [metrics.get(self._loss_key)]
        watched = run.loss_watched_step == step and self._watched_above is not None
        due = stats.add_steps(steps, losses, judged=watched)
        if due or self._check_now:
            self._check_now = False
            started = time.perf_counter()
            self.check(run)
            stats.check_took(time.perf_counter() - started)
            if self._verdict_due is not None:
                self._check_at(step)
        self._watch_all = False
        self._watch_losses(run)  # a check (or a restored state) moved a threshold
        if (self._skipper is None or run.loss_watched_step == step) and not self._agreeing():
            # gradients are measured on some steps only: after_backward sleeps until the
            # next (a check may have moved it), unless each step's loss is judged after
            # backward (see on_after_backward)
            run.sleep_until(self, stats.backward_due, Event.AFTER_BACKWARD)
        else:
            run.wake(self, Event.AFTER_BACKWARD)
        self._sleep(run, step, watched or losses[-1].__class__ is not float)

    def _sleep(self, run: RunContext, step: int, may: bool) -> None:
        """Sleep through the steps until the next one that needs a look (``stats.next_due``):
        the kernel keeps their losses and its watch flags a NaN, a jump or an outlier among
        them (``may``: it sees the loop's host losses, or there are none to see)."""
        if may:
            wake = self.stats.next_due(step)
            if wake > step + 1:
                run.sleep_until(self, wake)

    # skipping an outlier's update -----------------------------------------------------------
    def _judge_update(self, run: RunContext, step: int, value: float) -> None:
        """Before the optimizer's update: skip it when the step's loss is an outlier."""
        skipper = self._skipper
        if skipper is None:
            return
        if skipper.skips(step, value):  # type: ignore[attr-defined]
            self._skip_next_update()
            self._repaired.append(step)
            run.wake(self)  # its end puts the optimizers' step back
            run.record_event(EventKind.MONITOR, "skipped_update",
                             skipper.describe_skip(step, value),  # type: ignore[attr-defined]
                             step=step, loss=value, rule="loss_spike")
        elif skipper.tail_step == step:  # type: ignore[attr-defined]
            self._trained_outlier(run, skipper, step, value, loss=value)

    def _trained_outlier(self, run: RunContext, rule: Rule, step: int, value: float,
                         **payload: Any) -> None:
        """An outlier trained as one of those the run keeps meeting (``prudent.monitor.tail``):
        kept out of the evidence of the rules that judge the updates, as a skipped one is (a
        known hard batch, judged once; two of them the only measured norms in a row looked
        like an explosion), and said once per rule, the first time, so that the user knows
        why the updates of its hard batches are no longer skipped."""
        self._tail_trained.append(step)
        if rule.name in self._tail_said:
            return
        self._tail_said.add(rule.name)
        run.record_event(EventKind.MONITOR, "outlier_trained",
                         rule.describe_tail(step, value),  # type: ignore[attr-defined]
                         step=step, rule=rule.name, **payload)

    def _judge_norm(self, run: RunContext, step: int, loss: Any) -> None:
        """Before the update: skip it when the step's gradient norm is far above its median
        (exploding_gradient's skip), on the steps judged whatever the timing: grid steps and
        a step whose loss jumped (a step loss_spike skipped already is neither judged nor in
        the median)."""
        grid = on_grid(step)
        if (not grid and self._norm_judged != step) or (self._repaired
                                                         and self._repaired[-1] == step):
            return
        norm = self.stats.host_norm(step)
        if norm is None:
            if self.stats.measured(step):  # on a device: reading it would wait
                self._no_norm_skip(run, "the gradients are on a device and reading their norm "
                                   "before each judged update would make those steps wait")
            return
        rule = self._norm_skipper
        # a step whose loss was trained as one of the outliers the run keeps meeting: its norm
        # is the same hard batch's (one verdict per step), kept only as the median's
        loss_tail = self._skipper is not None and self._skipper.tail_step == step  # type: ignore[attr-defined]
        ratio = rule.skips(step, norm, grid, judge=not loss_tail)
        if grid:
            rule.note_loss(run.host_scalar(loss))
            self._norm_bar = rule.loss_bar()
            self._watch_losses(run)
        if ratio:
            self._skip_next_update()
            self._repaired.append(step)
            run.wake(self)  # its end puts the optimizers' step back
            run.record_event(EventKind.MONITOR, "skipped_update",
                             rule.describe_skip(step, norm, ratio), step=step, grad_norm=norm,
                             median=norm / ratio, rule="exploding_gradient")
        elif rule.tail_step == step:
            self._trained_outlier(run, rule, step, norm, grad_norm=norm)

    def _no_norm_skip(self, run: RunContext, why: str) -> None:
        self._norm_skipper.outliers_from_checks = True  # the tail forms from the checks then
        self._norm_skipper, self._norm_bar = None, math.inf
        self.stats.measure_grid(False)
        self._say_blind(run, "exploding_gradient", "exploding_gradient does not skip updates "
                        f"here: {why}; the norms are still judged at each check, for the stop")

    def _post_vote(self, run: RunContext, loss: Any) -> None:
        """BEFORE_BACKWARD under torchrun: this rank's vote on skipping the step's update (how
        many standard deviations its loss is above its mean, 0 if no outlier), posted to the
        other ranks; :meth:`_judge_agreed` reads the result after the backward pass."""
        step = run.state.step + 1
        if not self._agreeing() or (self._repaired and self._repaired[-1] == step):
            return  # (gradient accumulation: this step's update is skipped already)
        value = run.host_scalar(loss)
        if value.__class__ is not float:
            value = self._device_loss(run, loss)  # every rank alike: all losses on devices
            if value is None:
                return
        mine = self._skipper.judge_outlier(step, value)  # type: ignore[union-attr]
        tail = 1.0 if self._skipper.tail_step == step else 0.0  # type: ignore[union-attr]
        self._vote = (step, value, mine, self._agree.post_max(mine, tail))

    def _judge_agreed(self, run: RunContext, step: int, loss: Any) -> None:
        """Under torchrun: each rank judges its own loss, and the update is skipped on every
        rank when any rank's loss is an outlier (a MAX over prudent's gloo group, posted before
        the backward pass; only where losses are read on the host). Each rank counts the
        agreed skips in its budget, so the budgets stay alike too; a step one rank trained as
        its tail's (``prudent.monitor.tail``) is kept out of every rank's evidence alike."""
        skipper = self._skipper
        if self._repaired and self._repaired[-1] == step:
            return  # gradient accumulation: this step's update is skipped already
        if self._vote is None or self._vote[0] != step:  # a loop with no BEFORE_BACKWARD
            self._post_vote(run, loss)
            if self._vote is None or self._vote[0] != step:
                return
        _, value, mine, pending = self._vote
        self._vote = None
        agreed, tail = pending.result()
        if not agreed > 0 or not skipper.take_skip(step):  # type: ignore[union-attr]
            if skipper.tail_step == step:  # type: ignore[union-attr]
                self._trained_outlier(run, skipper, step, value, loss=value)  # type: ignore[arg-type]
            elif tail > 0:  # another rank's known hard batch: no evidence here either
                self._tail_trained.append(step)
            return
        self._skip_next_update()
        self._repaired.append(step)
        run.wake(self)  # its end puts the optimizers' step back
        if mine > 0:
            said = skipper.describe_skip(step, value)  # type: ignore[union-attr]
        else:
            said = (f"another rank's loss at step {step} was {agreed:.3g} standard deviations "
                    "above its moving mean (this rank's: "
                    f"{fmt(value)}): its optimizer update was skipped")
        run.record_event(EventKind.MONITOR, "skipped_update", f"{said}, on all "
                         f"{run.world_size} ranks alike", step=step, loss=value,
                         rule="loss_spike", ranks_agreed=True, sigmas=_number(agreed))

    def _judge_device_loss(self, run: RunContext, step: int, loss: Any) -> None:
        value = self._device_loss(run, loss)
        if value is not None and value > self._skipper.watch_above:  # type: ignore[union-attr]
            self._judge_update(run, step, value)

    def _device_loss(self, run: RunContext, loss: Any) -> float | None:
        """A loss on a device: read it only if the user accepts a wait per step."""
        spike = self._skipper
        if spike is not None and spike.settings.skip_sync and hasattr(loss, "item"):  # type: ignore[attr-defined]
            return float(loss.item())
        self._skipper = None
        self._watch_losses(run)
        self._say_blind(run, "loss_spike", "loss_spike does not skip outlier updates here: the "
                        "loss is on a device and reading it before each update would make every "
                        "step wait (set monitor.rules.loss_spike.skip_sync: true to allow it); "
                        "spikes are still judged at each check, for rollback")
        return None

    def _skip_next_update(self) -> None:
        """Make each attached optimizer's next ``step()`` a no-op (put back when called)."""
        for optimizer in self.stats.optimizers:
            replace_next_step(optimizer, "skipped")
            self._skipped.append(optimizer)

    def _unskip(self) -> None:
        for optimizer in self._skipped:
            put_back_step(optimizer, "skipped")
        self._skipped = []

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        self._num_logs += 1  # progress, for the watchdog
        if "early_stopping" in self.rules and validation_metric(metrics) is not None:
            run.evaluated()  # its keeps at the next evaluations hold the generators before it
        self.check(run, metrics)
        run.wake(self)  # the check may have moved what is due next: planned again at the step

    def on_stop_requested(self, run: RunContext, reason: StopReason) -> None:
        if self._watchdog is not None:
            self._watchdog.unwinding = True  # the loop reached its stop check by itself

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        self._stop_watchdog()
        try:
            self.check(run)  # the last steps' findings are recorded, even if nothing can act
        except Exception as exc:  # noqa: BLE001 - the run must still close its record
            run.record_event(EventKind.MONITOR, "error", f"the final check failed: {exc!r}")
        if self._skipped:
            self._unskip()
        for name, rule in self.rules.items():
            reason = getattr(rule, "blind_reason", lambda: None)()
            if reason and self._num_logs:
                self._say_blind(run, name, reason)
        if self._webhook is not None:
            self._webhook.close()

    def state_dict(self) -> dict[str, Any]:
        steps, losses = self.stats.pending()  # not yet judged: the next window's start
        if self._kept is not None:
            steps += self._kept.steps
            losses += [saved_loss(v) for v in self._kept.values]
        return {"pending": {"steps": steps, "losses": losses},
                "repaired": list(self._repaired),  # the pending steps whose update was skipped
                "tail_trained": list(self._tail_trained),  # ... or trained as the tail's
                "rules": {name: rule.state_dict() for name, rule in self.rules.items()},
                "actions": {name: a.state_dict() for name, a in self.actions.items()},
                "muted_until": dict(self._muted_until), "peak_lr": self.stats.peak_lr,
                "best_checkpoint": self.best_checkpoint, "start_loss": self.start_loss,
                "judged_evals": list(self._judged_evals),
                "tail_said": sorted(self._tail_said)}  # a resumed run does not say it again

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, rule_state in state.get("rules", {}).items():
            if name in self.rules:
                self.rules[name].load_state_dict(rule_state)
        for name, action_state in state.get("actions", {}).items():
            if name in self.actions:
                self.actions[name].load_state_dict(action_state)
        pending = state.get("pending")
        if pending:
            self.stats.restore_pending(pending["steps"], pending["losses"])
        self._repaired = list(state.get("repaired", []))
        self._tail_trained = list(state.get("tail_trained", []))
        self._muted_until = dict(state.get("muted_until", {}))
        if self._norm_skipper is not None:
            self._norm_bar = self._norm_skipper.loss_bar()
        self._watch_all = True  # restored after the watch was set: the next loss is looked at
        self.stats.peak_lr = state.get("peak_lr")
        self.best_checkpoint = state.get("best_checkpoint")
        self.start_loss = state.get("start_loss")
        step, names = state.get("judged_evals") or (-1, [])
        self._judged_evals = (int(step), list(names))
        self._tail_said = set(state.get("tail_said", []))

    def _new_evaluation(self, step: int, logged: dict[str, float]) -> bool:
        """Not an evaluation already judged at this step (another run.log at the same step
        with other metrics is new: val_loss, then val_acc)."""
        judged_step, names = self._judged_evals
        if step != judged_step:
            self._judged_evals = (step, sorted(logged))
            return True
        if set(logged) <= set(names):
            return False
        self._judged_evals = (step, sorted(set(names) | set(logged)))
        return True

    # judging ------------------------------------------------------------------------------
    def check(self, run: RunContext, logged: dict[str, float] | None = None) -> list[Firing]:
        """Run every rule on the statistics gathered since the last check; act on findings."""
        if self._kept is not None:  # the steps slept through (a log, the end)
            self.stats.add_steps(*self._kept.take(), judged=True)
        window = self.stats.take_window()
        planned = run.state.planned_steps
        if planned is not None and planned != self._fitted_for and self.settings.size_to_run:
            self._fit(run, planned)
        window.planned_steps, window.step_s = planned, self.stats.last_step_s
        # the interval layers are sampled at, not a sooner sample a rule asked for
        window.sample_every = self._sample_every or self.stats.sample_every
        self._count_train_loss(window)
        window.start_loss = self._start_loss(window)
        if logged is not None and self._new_evaluation(run.state.step, logged):
            window.evals.append(EvalSample(run.state.step, dict(logged), *self._mean_train_loss()))
        if self._repaired:  # repair before stop: what the skipped updates measured is no
            window.repaired = frozenset(self._repaired)  # evidence for the rules after it
            self._repaired = [s for s in self._repaired if s > run.state.step]
        if self._tail_trained:
            window.tail = frozenset(self._tail_trained)
            self._tail_trained = [s for s in self._tail_trained if s > run.state.step]
        firings = [Firing(name, self._after_repair(name, finding, window), run.state.step)
                   for name, finding in self._findings(run, window)]
        self._keep_best(run)
        rollback = self.actions.get("rollback")
        done = rollback.count if isinstance(rollback, RollbackAction) else 0
        # a condition that came back after a rollback is the diagnosis: it goes first (and
        # stops), rather than another repair of its symptom
        ordered = sorted((self._noting_came_back(f) for f in firings),
                         key=lambda pair: (not pair[1], _began(pair[0])))
        decided: list[tuple[Firing, str]] = []
        for firing, _ in ordered:
            if isinstance(rollback, RollbackAction) and rollback.count > done:
                rule = self.rules.get(firing.rule)
                if hasattr(rule, "rolled_back"):
                    # the rollback took these steps back: a rule that smooths the loss judged
                    # losses of weights that are gone (a corrupted shard's spike also climbs
                    # for a while)
                    continue
                if getattr(rule, "judges_updates", False) and rollback.last is not None \
                        and _began(firing) > rollback.last[1]:
                    # repair before stop: what those updates did is undone; a gradient that
                    # explodes at a learning rate too high does it again on the steps after,
                    # and stops then (or the rollbacks run out)
                    self._repaired_by_rollback(run, firing, rollback.last[1])
                    continue
            outcome = self.fire(run, firing)
            if outcome is not None:
                decided.append((firing, outcome))
        if len(decided) > 1:
            self._record_decision(run, decided)
        if isinstance(rollback, RollbackAction) and rollback.count > done:
            self._rolled_back()
        self._ask_verdicts(run, window)
        return firings

    def _after_repair(self, name: str, finding: Finding, window: Window) -> Finding:
        """A rule that judges the updates fired although some were skipped: say so (the
        repair did not hold), naming the skipped steps."""
        if not window.repaired or not getattr(self.rules.get(name), "judges_updates", False):
            return finding
        steps = sorted(window.repaired)
        plural = "s" * (len(steps) > 1)
        return dataclasses.replace(finding, message=(
            f"{finding.message}; it persisted after the update{plural} of step{plural} "
            f"{', '.join(map(str, steps))} {'were' if plural else 'was'} skipped"))

    def _noting_came_back(self, firing: Firing) -> tuple[Firing, bool]:
        """The firing, its message saying so when a rule that judges the updates fires again
        on steps after a rollback that had undone its evidence (the repair did not hold), and
        whether it did."""
        rollback = self.actions.get("rollback")
        last = rollback.last if isinstance(rollback, RollbackAction) else None
        rule = self.rules.get(firing.rule)
        if last is None or not getattr(rule, "judges_updates", False) or _began(firing) <= last[0]:
            return firing, False
        assert isinstance(rollback, RollbackAction)
        said = (f"{firing.finding.message}; it came back after rollback {rollback.count} to step "
                f"{last[1]} (of the spike that began at step {last[0]})")
        return dataclasses.replace(firing, finding=dataclasses.replace(firing.finding,
                                                                       message=said)), True

    def _repaired_by_rollback(self, run: RunContext, firing: Firing, restored: int) -> None:
        f = firing.finding
        said = f.message.split("; it persisted after")[0]  # it did not: the rollback undid it
        run.record_event(EventKind.MONITOR, "repaired", f"{firing.rule}: {said}; not acted "
                         f"on: the rollback to step {restored} undid the updates it judged",
                         step=f.step, rule=firing.rule, detected_at=firing.detected_at,
                         checkpoint_step=restored)

    def _rolled_back(self) -> None:
        """Rules that smooth the loss forget the steps a rollback took back; loss_spike's
        baseline too when the weights went back beyond it (its losses were of weights trained
        further: the restored ones' loss would read as a spike that lasts)."""
        last = self._rollback().last
        for rule in self.rules.values():
            forget = getattr(rule, "rolled_back", None)
            if forget is not None:
                forget()
            restored_to = getattr(rule, "restored_to", None)
            if restored_to is not None and last is not None:
                restored_to(last[1])
        spike = self.rules.get("loss_spike")
        if spike is not None and last is not None:
            spike.rewound(last[0] - last[1])  # type: ignore[attr-defined]

    def _ask_verdicts(self, run: RunContext, window: Window) -> None:
        """The soonest step at which a rule says it may reach a verdict (``verdict_due``: a
        block of losses that closes, a sample that would complete a streak), so that check
        comes then instead of up to a check interval later (on a 3,000-step run checks space
        ~60 steps apart, a fifth of loss_not_decreasing's whole verdict); a rule that judges
        layer samples gets its next sample then too. Costs nothing on a healthy run's steps:
        asked at checks, and only a streak begun asks for anything."""
        step = run.state.step
        due = sample_due = None
        for rule in self.rules.values():
            asked = getattr(rule, "verdict_due", None)
            at = asked(step) if asked is not None else None
            if at is None or at <= step:
                continue
            due = at if due is None else min(due, at)
            if rule.needs & _SAMPLED:
                sample_due = at if sample_due is None else min(sample_due, at)
        self._verdict_due = due
        if due is not None:
            self._check_at(step)
        self._sample_at(run, window, sample_due)

    def _sample_at(self, run: RunContext, window: Window, due: int | None) -> None:
        """Layers sampled at ``due`` (a sooner sample, once), or back on their interval."""
        stats, planned = self.stats, self._fitted_for
        if window.layers:
            self._last_sample = window.layers[-1].step
        if planned is None:
            return
        if (due is not None and self._last_sample is not None and due > self._last_sample
                and due > run.state.step + 1):  # activation hooks are armed the step before
            if self._sample_every is None:
                self._sample_every = stats.sample_every
            stats.fit(planned, due - self._last_sample, step=run.state.step)
        elif due is None and self._sample_every is not None:
            stats.fit(planned, self._sample_every, step=run.state.step)
            self._sample_every = None

    def _check_at(self, step: int) -> None:
        """Bring the next check forward to the step a rule asked for (the check interval is
        set again by the check that follows, so only that one check moves)."""
        stats, due = self.stats, self._verdict_due
        if due is not None and due > step:
            stats.check_every = min(stats.check_every, due - step)

    def _set_check_grid(self) -> None:
        """The most steps between two checks (StepStats.next_due): the rules' grid, for what
        they renew only at its multiples (loss_spike's skip threshold)."""
        for rule in self.rules.values():
            rule.check_grid = self.stats.max_check_every

    def _fit(self, run: RunContext, planned: int) -> None:
        """Size the rules (and the sampling) to a run of ``planned`` steps."""
        self._fitted_for = planned
        if "sample_every_steps" not in self.settings.model_fields_set:
            # layers sampled every ~2.5% of the run, never more often than every 20 steps
            self.stats.fit(planned, max(20, min(self.settings.sample_every_steps, planned // 40)),
                           step=run.state.step)
        else:
            self.stats.fit(planned, step=run.state.step)
        if "max_check_every_steps" not in self.settings.model_fields_set:
            # checks at least every ~2% of the run, whatever its length: on a short run of
            # millisecond steps the overhead budget alone would space them 100 steps apart, a
            # fifth of a 448-step run (~50 extra checks of ~0.2 ms: tens of ms for the whole
            # run); a long one may space them up to its fiftieth when checks are dear (a 6,000-
            # step run of 1 ms steps: every ~120 steps, not every 100, for the 0.2% budget)
            stats = self.stats
            stats.max_check_every = max(stats.min_check_every, planned // 50)
            stats.check_every = min(stats.check_every, stats.max_check_every)
        self._set_check_grid()
        for name, rule in self.rules.items():
            reason = rule.fit(planned)
            if reason:
                self._say_blind(run, name, reason)

    def _say_blind(self, run: RunContext, rule: str, reason: str) -> None:
        """Once per rule and run: it cannot judge (the run is too short, a metric is missing)."""
        if rule not in self._said_blind:
            self._said_blind.add(rule)
            run.record_event(EventKind.MONITOR, "blind", reason, rule=rule)

    # early stopping's best weights ----------------------------------------------------------
    def _keep_best(self, run: RunContext) -> None:
        rule = self.rules.get("early_stopping")
        if rule is None or not getattr(rule, "improved", False) or run.checkpoints is None:
            return
        rule.improved = False  # type: ignore[attr-defined]  # kept once per new best
        if rule.settings.restore_best:  # type: ignore[attr-defined]
            self.best_checkpoint = run.checkpoints.keep(run, "best")

    def _restore_best(self, run: RunContext, firing: Firing) -> str:
        if firing.rule != "early_stopping" or run.pending_stop is None:
            return ""
        rule = self.rules["early_stopping"]
        if not rule.settings.restore_best:  # type: ignore[attr-defined]
            return ""
        if self.best_checkpoint is None or run.checkpoints is None:
            return "; restore_best: no checkpoint of the best evaluation (checkpoints off?)"
        restored = run.checkpoints.restore(run, name=self.best_checkpoint)
        if restored is None:
            why = getattr(run.checkpoints, "cannot_restore", None)
            return (f"; restore_best: {self.best_checkpoint} "
                    + (f"not restored: {why}" if why else "could not be read"))
        run.record_event(EventKind.MONITOR, "best_restored", f"early stopping: the weights of "
                         f"the best evaluation (step {restored[1]}, {restored[0]}) are put back",
                         checkpoint=restored[0], checkpoint_step=restored[1])
        return f"; best weights (step {restored[1]}) restored"

    def _rollback(self) -> RollbackAction:
        return self.actions["rollback"]  # type: ignore[return-value]

    def _findings(self, run: RunContext, window: Window) -> list[tuple[str, Finding]]:
        found = []
        present = window.present()
        for name, rule in list(self.rules.items()):
            if not rule.needs & present:
                continue  # nothing this rule reads (most windows have no samples)
            try:
                finding = rule.check(window)
            except Exception as exc:  # noqa: BLE001 - a broken user rule must not kill training
                del self.rules[name]
                run.record_event(EventKind.MONITOR, "rule_error", f"rule {name} raised {exc!r} and is "
                                 "switched off for the rest of the run")
                continue
            if finding is not None:
                found.append((name, finding))
        return found

    def fire(self, run: RunContext, firing: Firing) -> str | None:
        """Announce a firing and run its rule's actions (unless the rule is cooling down:
        then None); returns what the actions did."""
        rule = self.rules.get(firing.rule)
        if rule is None or firing.detected_at < self._muted_until.get(firing.rule, -1):
            return None
        self._muted_until[firing.rule] = firing.detected_at + rule.settings.cooldown_steps
        names = list(rule.settings.action)
        outcome = "; ".join(self.actions[a].apply(run, firing) for a in names)
        outcome += self._restore_best(run, firing)
        self.firings.append(firing)
        self._announce(run, firing, names, outcome)
        return outcome

    def _record_decision(self, run: RunContext, decided: list[tuple[Firing, str]]) -> None:
        """Several rules fired in one check: one event says what was decided, by which rule
        (the one whose action weighs most on the run: a stop, then a rollback, a lower
        learning rate, a skip, an alert), and every finding behind it with what its actions
        did, in the order they were acted on."""
        def weight(pair: tuple[Firing, str]) -> int:
            actions = self.rules[pair[0].rule].settings.action
            return max((_ACTION_WEIGHT.get(a, 0) for a in actions), default=0)

        first, outcome = max(decided, key=weight)  # the first of the heaviest
        also = "; ".join(f"{f.rule} ({f.finding.message}) -> {o}" for f, o in decided
                         if f is not first)
        run.record_event(
            EventKind.MONITOR, "decision",
            f"{len(decided)} rules fired at step {first.detected_at}: {first.rule} decided "
            f"({first.finding.message}) -> {outcome}; with it: {also}",
            step=first.finding.step, decided_by=first.rule, outcome=outcome,
            findings=[{"rule": f.rule, "step": f.finding.step, "message": f.finding.message,
                       "action": list(self.rules[f.rule].settings.action), "outcome": o}
                      for f, o in decided])

    def _announce(self, run: RunContext, firing: Firing, actions: list[str], outcome: str) -> None:
        f = firing.finding
        run.record_event(EventKind.RULE, firing.rule, f.message, step=f.step, value=_number(f.value),
                         threshold=_number(f.threshold), action=actions, outcome=outcome,
                         detected_at=firing.detected_at)
        if not self.quiet:
            print(f"prudent | {run.id} | rule {firing.rule}: {f.message} -> {outcome}",
                  file=self.stream or sys.stderr, flush=True)
        if self._webhook is not None:
            self._webhook.send({"run_id": run.id, "run_name": run.name, "rule": firing.rule,
                                "step": f.step, "detected_at": firing.detected_at,
                                "value": _number(f.value), "threshold": _number(f.threshold),
                                "message": f.message, "action": actions, "outcome": outcome,
                                "host": host_name(), "time": time.time()})

    def _count_train_loss(self, window: Window) -> None:
        values = [v for _, v in window.finite_losses()]
        self._train_loss[0] += sum(values)
        self._train_loss[1] += len(values)
        self._train_loss[2] += sum(v * v for v in values)

    def _start_loss(self, window: Window) -> float | None:
        """Where the run's loss started (the median: an exploding first step is no start)."""
        if self.start_loss is None:
            room = START_STEPS - len(self._start_values)
            self._start_values += [v for _, v in window.finite_losses()[:room]]
            if len(self._start_values) == START_STEPS:
                self.start_loss = sorted(self._start_values)[START_STEPS // 2]
        return self.start_loss

    def _mean_train_loss(self) -> tuple[float | None, float | None]:
        """The mean training loss since the last log, and its standard error."""
        total, count, squares = self._train_loss
        self._train_loss = [0.0, 0, 0.0]
        if not count:
            return None, None
        mean = total / count
        if count < 2:
            return mean, None
        variance = max(0.0, (squares - count * mean * mean) / (count - 1))
        return mean, math.sqrt(variance / count)

    # the stalled rule ---------------------------------------------------------------------
    def _start_watchdog(self, run: RunContext) -> None:
        s = self.rules["stalled"].settings
        self._watchdog = StallWatchdog(
            timeout_s=s.timeout_s, startup_timeout_s=s.startup_timeout_s,  # type: ignore[attr-defined]
            grace_s=s.grace_s,  # type: ignore[attr-defined]
            progress=lambda: (run.state.step, (run.state.epoch, run.state.batches_in_epoch,
                                               self._num_logs)),
            on_stall=lambda idle, started: self._on_stall(run, idle, started),
            stop_pending=lambda: run.stop_requested is not None,
            interrupt=self._interrupt_main, hard_exit=lambda: self._hard_exit(run))
        self._install_wake_handler()
        self._watchdog.start()

    def _on_stall(self, run: RunContext, idle_s: float, started: bool) -> bool:
        rule: Any = self.rules.get("stalled")
        step = run.state.step
        if rule is None or rule.check_idle(idle_s, step, started) is None:
            return False
        # under torchrun each rank writes its own file, its verdict first; rank 0 then names
        # the hung rank from its peers' files (it cannot ask them: one of them hangs)
        stacks = RankStacks(run.run_dir, since=time.time() - idle_s)
        finding = rule.check_idle(idle_s, step, started, stacks=stacks.note())
        try:
            stacks.write(f"prudent: {finding.message}\nrun {run.id}, pid {os.getpid()}, "
                         f"{time.ctime()}")
        except OSError as exc:
            run.record_event(EventKind.MONITOR, "stacks_not_written", f"cannot write stacks: {exc}")
        peers = stacks.peers_note(min(PEER_WAIT_S, rule.settings.timeout_s))
        if peers is not None:
            finding = rule.check_idle(idle_s, step, started, stacks=peers)
        self.fire(run, Firing("stalled", finding, step))
        return True

    def _install_wake_handler(self) -> None:
        if _WAKE_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(_WAKE_SIGNAL) in (signal.SIG_DFL, None):
            self._previous_handler = signal.signal(_WAKE_SIGNAL, self._on_wake_signal)
            self._wake_installed = True

    def _on_wake_signal(self, signum: int, _frame: Any) -> None:
        if self._interrupting:
            self._interrupting = False
            raise StopRun(StopReason.by_rule(
                "stalled", "the training loop was stuck and did not reach its stop check; "
                "interrupted by prudent (SIGUSR2)"))

    def _interrupt_main(self) -> None:
        self._interrupting = True
        main = threading.main_thread().ident
        if self._wake_installed and main is not None:
            signal.pthread_kill(main, _WAKE_SIGNAL)  # type: ignore[arg-type]
        else:
            import _thread

            _thread.interrupt_main()  # no handler of ours: a KeyboardInterrupt, once Python runs

    def _hard_exit(self, run: RunContext) -> None:
        if not run.exit_on_stop:
            return  # a notebook's kernel is never killed
        reason = run.pending_stop or StopReason.by_rule("stalled", "the training loop was stuck")
        run.record_event(EventKind.MONITOR, "hard_exit", "the training loop ignored SIGUSR2 for "
                         f"{self._watchdog.grace_s if self._watchdog else 0:g} s: exiting with "
                         f"code {reason.exit_code} ({reason})", reason=str(reason))
        # the training thread is stuck: close the record without waiting on the components
        run.finish("stopped", reason, reason.message, notify=False)
        os._exit(reason.exit_code)

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        if self._wake_installed and threading.current_thread() is threading.main_thread():
            signal.signal(_WAKE_SIGNAL, self._previous_handler)  # type: ignore[arg-type]
            self._wake_installed = False


_ACTION_WEIGHT = {"stop": 5, "prune": 5, "rollback": 4, "reduce_lr": 3, "skip": 2}


def _began(firing: Firing) -> int:
    """The step a finding's condition began (a spike's first step), for the firing order."""
    finding = firing.finding
    return finding.since if finding.since is not None else finding.step


def _number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those go out as text."""
    if value is None or math.isfinite(value):
        return value
    return str(value)

