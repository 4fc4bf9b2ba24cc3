"""Monitor: the component that runs the rules on the loop's statistics and acts on findings.

On the hot path (``after_backward``, ``step_end``) it only keeps device references; every
``check_every_steps`` steps, at each ``run.log`` and at the end, it reads them into a
:class:`Window` and asks every rule. A rule that fires is announced (event, stderr line,
webhook) and its actions run. The ``stalled`` rule is judged by a watchdog thread instead.
"""

from __future__ import annotations

import math
import operator
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from prudent.errors import StopRun
from prudent.events import Component, Event, EventKind
from prudent.monitor.actions import Action, Firing, build_actions
from prudent.monitor.base import EvalSample, Finding, Rule, Window
from prudent.monitor.registry import RULES
from prudent.monitor.settings import MonitorSettings
from prudent.monitor.stats import StepStats
from prudent.monitor.watchdog import StallWatchdog, dump_stacks
from prudent.monitor.webhook import WebhookSender
from prudent.stop import StopReason

if TYPE_CHECKING:
    from prudent.context import RunContext

__all__ = ["Monitor", "build_rules"]

STACKS_FILE = "stalled-stacks.txt"
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
        self.actions: dict[str, Action] = build_actions(self.settings.actions)
        self.firings: list[Firing] = []
        self.stream = stream
        self.quiet = quiet
        self._muted_until: dict[str, int] = {}
        self._train_loss = [0.0, 0]  # sum and count of finite losses since the last log
        self._watchdog: StallWatchdog | None = None
        self._webhook: WebhookSender | None = None
        self._previous_handler: Any = None
        self._wake_installed = False
        self._interrupting = False
        self._num_logs = 0
        self._loss_key = self.settings.loss_key
        self._backward_hooked = True  # start-up: norms on every step until a window is measured

    # events -------------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        url = self.settings.actions.alert.url()
        if url:
            self._webhook = WebhookSender(url, self.settings.actions.alert.timeout_s,
                                          on_error=lambda m: run.record_event(EventKind.MONITOR,
                                                                              "webhook_failed", m))
        if "stalled" in self.rules:
            self._start_watchdog(run)

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        self.stats.attach(objects)

    def on_after_backward(self, run: RunContext, loss: Any) -> None:
        step = run.state.step + 1
        if step >= self.stats.backward_due:  # the hot path: most steps have nothing to measure
            self.stats.after_backward(step)

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        stats = self.stats
        if stats.step_end(run.state.step, run.host_scalar(metrics.get(self._loss_key))):
            started = time.perf_counter()
            self.check(run)
            stats.check_took(time.perf_counter() - started)
        # gradients are measured on some steps only: on the others, after_backward is not called
        if (run.state.step + 1 >= stats.backward_due) is not self._backward_hooked:
            self._backward_hooked = not self._backward_hooked
            run.subscribe(self, Event.AFTER_BACKWARD, self._backward_hooked)

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        self._num_logs += 1  # progress, for the watchdog
        self.check(run, metrics)

    def on_stop_requested(self, run: RunContext, reason: StopReason) -> None:
        if self._watchdog is not None:
            self._watchdog.unwinding = True  # the loop reached its stop check by itself

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        self._stop_watchdog()
        try:
            self.check(run)  # the last steps' findings are recorded, even if nothing can act
        except Exception as exc:  # noqa: BLE001 - the run must still close its record
            run.record_event(EventKind.MONITOR, "error", f"the final check failed: {exc!r}")
        if self._webhook is not None:
            self._webhook.close()

    def state_dict(self) -> dict[str, Any]:
        return {"rules": {name: rule.state_dict() for name, rule in self.rules.items()},
                "actions": {name: a.state_dict() for name, a in self.actions.items()},
                "muted_until": dict(self._muted_until), "peak_lr": self.stats.peak_lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, rule_state in state.get("rules", {}).items():
            if name in self.rules:
                self.rules[name].load_state_dict(rule_state)
        for name, action_state in state.get("actions", {}).items():
            if name in self.actions:
                self.actions[name].load_state_dict(action_state)
        self._muted_until = dict(state.get("muted_until", {}))
        self.stats.peak_lr = state.get("peak_lr")

    # judging ------------------------------------------------------------------------------
    def check(self, run: RunContext, logged: dict[str, float] | None = None) -> list[Firing]:
        """Run every rule on the statistics gathered since the last check; act on findings."""
        window = self.stats.take_window()
        self._count_train_loss(window)
        if logged is not None:
            window.evals.append(EvalSample(run.state.step, dict(logged), self._mean_train_loss()))
        firings = [Firing(name, finding, run.state.step)
                   for name, finding in self._findings(run, window)]
        for firing in sorted(firings, key=lambda f: f.finding.step):
            self.fire(run, firing)
        return firings

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

    def fire(self, run: RunContext, firing: Firing) -> None:
        """Announce a firing and run its rule's actions (unless the rule is cooling down)."""
        rule = self.rules.get(firing.rule)
        if rule is None or firing.detected_at < self._muted_until.get(firing.rule, -1):
            return
        self._muted_until[firing.rule] = firing.detected_at + rule.settings.cooldown_steps
        names = list(rule.settings.action)
        outcome = "; ".join(self.actions[a].apply(run, firing) for a in names)
        self.firings.append(firing)
        self._announce(run, firing, names, outcome)

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
                                "host": socket.gethostname(), "time": time.time()})

    def _count_train_loss(self, window: Window) -> None:
        losses = window.finite_losses()
        self._train_loss[0] += sum(map(operator.itemgetter(1), losses))
        self._train_loss[1] += len(losses)

    def _mean_train_loss(self) -> float | None:
        total, count = self._train_loss
        self._train_loss = [0.0, 0]
        return total / count if count else None

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
        rule = self.rules.get("stalled")
        finding = rule.check_idle(idle_s, run.state.step, started) if rule else None  # type: ignore[attr-defined]
        if finding is None:
            return False
        header = f"prudent: {finding.message}\nrun {run.id}, pid {os.getpid()}, {time.ctime()}"
        try:
            dump_stacks(run.run_dir / STACKS_FILE, header)
        except OSError as exc:
            run.record_event(EventKind.MONITOR, "stacks_not_written", f"cannot write stacks: {exc}")
        self.fire(run, Firing("stalled", finding, run.state.step))
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


def _number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those go out as text."""
    if value is None or math.isfinite(value):
        return value
    return str(value)

