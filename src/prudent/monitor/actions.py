"""What a rule firing does: stop, reduce_lr, alert, capture, prune, rollback, skip.

Whatever the action, every firing is announced the same way first (an event in the run's
store, a line on stderr, the webhook if one is set); the action is what happens next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from prudent.kernel.events import EventKind
from prudent.kernel.stop import StopReason
from prudent.monitor.base import Finding
from prudent.monitor.settings import ActionSettings, ReduceLRSettings, RollbackSettings

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["ACTIONS", "Action", "AlertAction", "CaptureAction", "Firing", "PruneAction",
           "ReduceLRAction", "RollbackAction", "SkipAction", "StopAction", "build_actions",
           "resume_hint"]


@dataclass(frozen=True)
class Firing:
    """A rule's finding, as the monitor saw it at step ``detected_at``."""

    rule: str
    finding: Finding
    detected_at: int


class Action:
    """Something done about a firing.

    Contract: ``apply(run, firing)`` returns a few words saying what it did (they go into the
    event), never raises, and only touches what is safe from another thread
    (``run.request_stop``, ``run.record_event``): the ``stalled`` rule fires from its watchdog
    thread while the training thread is stuck.
    """

    name: ClassVar[str] = "action"

    def apply(self, run: RunContext, firing: Firing) -> str:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class StopAction(Action):
    """Stop cleanly: ``StopRun`` at the next step; the run unwinds through ``with run:``, the
    checkpointer saves on ``stop_requested``, the exit code is 3 and the reason ``rule:<name>``."""

    name = "stop"

    def apply(self, run: RunContext, firing: Firing) -> str:
        finding = firing.finding
        if finding.finished:  # the training is done (early stopping): a completed run
            run.request_stop(StopReason.by_rule(firing.rule, finding.message, finished=True))
            return "the training is done: ending the run as completed"
        run.request_stop(StopReason.by_rule(firing.rule, f"{finding.message}. "
                                            f"{resume_hint(firing.rule)}"))
        return "stopping the run"


def resume_hint(rule: str) -> str:
    """How to go on anyway: the stop message says it (the run is resumable)."""
    return (f"To go on with this rule off, resume the run (same PRUDENT_RUN_ID, or `prudent run` "
            f"again) with `monitor: {{rules: {{{rule}: {{enabled: false}}}}}}` in prudent.yaml "
            f"(or set its thresholds there)")


class PruneAction(Action):
    """Stop as a pruned tuning trial (reason ``pruned``, exit code 5, never resumed)."""

    name = "prune"

    def apply(self, run: RunContext, firing: Firing) -> str:
        run.request_stop(StopReason.pruned(f"rule {firing.rule}: {firing.finding.message}",
                                           rule=firing.rule))
        return "pruning the trial"


class AlertAction(Action):
    """Only tell (the announcement every firing gets); training goes on."""

    name = "alert"

    def apply(self, run: RunContext, firing: Firing) -> str:
        return "alert only"


class CaptureAction(Action):
    """Ask for a failure capture of this step (event kind ``capture_requested``, then
    ``run.capture``: prudent.debug's FailureCapture writes the bundle, at once on the training
    thread, at the loop's next step from the stall watchdog's thread)."""

    name = "capture"

    def apply(self, run: RunContext, firing: Firing) -> str:
        run.record_event(EventKind.CAPTURE_REQUESTED, firing.rule, firing.finding.message,
                         step=firing.detected_at, reason=f"rule:{firing.rule}",
                         finding_step=firing.finding.step)
        run.capture(f"rule:{firing.rule}", firing.finding.message)
        return "capture requested"


# under torchrun each rank's rules judge its own losses at checks of its own timing: a repair
# one rank made alone would leave the replicas apart (skips are agreed, see the monitor)
ONE_RANK_ALONE = ("{action} under torchrun: each rank judges its own losses at its own "
                  "checks, and one rank changing its weights or learning rate alone would leave "
                  "the ranks' replicas apart")


class ReduceLRAction(Action):
    """Multiply the learning rate of every attached optimizer's param groups by ``factor``
    (never below ``min_lr``), and the ``base_lrs`` of attached LR schedulers so the schedule
    does not undo it; then ignore requests for ``cooldown_steps``."""

    name = "reduce_lr"

    def __init__(self, settings: ReduceLRSettings | None = None,
                 watched: dict[int, Any] | None = None) -> None:
        self.settings = settings or ReduceLRSettings()
        self.last_step: int | None = None
        self.watched = watched if watched is not None else {}  # see build_actions

    def apply(self, run: RunContext, firing: Firing) -> str:
        s, step = self.settings, firing.detected_at
        if self.last_step is not None and step - self.last_step < s.cooldown_steps:
            return f"reduce_lr in cooldown (reduced at step {self.last_step})"
        if run.world_size > 1:
            return ONE_RANK_ALONE.format(action="reduce_lr not applied")
        optimizers, schedulers = _optimizers_and_schedulers(run.objects, self.watched)
        if not optimizers:
            return "reduce_lr: no optimizer attached (run.attach(optimizer=...))"
        before, after = _scale_lrs(optimizers, s.factor, s.min_lr)
        _scale_schedulers(schedulers, s.factor, s.min_lr)
        if after == before:
            return f"reduce_lr: the learning rate is already at its floor {s.min_lr:g}"
        self.last_step = step
        return f"learning rate {before:.3g} -> {after:.3g}"

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = state.get("last_step")


class SkipAction(Action):
    """Skip the optimizer update of single outlier steps. It acts before each update, not on a
    firing (the monitor asks the rule, see ``LossSpikeRule.skips``): when its rule fires, the
    outliers were more than a skip can repair, and the next action in the list runs."""

    name = "skip"

    def apply(self, run: RunContext, firing: Firing) -> str:
        return "past the skips allowed per window"


class RollbackAction(Action):
    """Put the attached objects back as they were in the newest good checkpoint from before
    the spike began, skip the next ``skip_batches`` batches, scale the learning rate by
    ``lr_factor``; after ``max_rollbacks`` rollbacks, stop instead. Training thread only."""

    name = "rollback"

    def __init__(self, settings: RollbackSettings | None = None,
                 watched: dict[int, Any] | None = None) -> None:
        self.settings = settings or RollbackSettings()
        self.watched = watched if watched is not None else {}  # see build_actions
        self.count = 0
        self.skip_left = 0  # batches still to skip (read it; take them with take_skip)
        self.skips_batches = False  # the loop uses run.batches: skipping data is possible
        self.state: Any = None  # the run's counters (the monitor's start): a skipped batch
        # moves the epoch on
        self.last: tuple[int, int] | None = None  # the last rollback: spike's step, restored step

    def apply(self, run: RunContext, firing: Firing) -> str:
        s, finding = self.settings, firing.finding
        spike = finding.since if finding.since is not None else finding.step
        if run.pending_stop is not None:  # another rule stopped the run at this check
            return "not rolled back: the run is stopping"
        if self.count >= s.max_rollbacks:
            return self._stop(run, firing, f"{self.count} rollbacks already (max_rollbacks "
                              f"{s.max_rollbacks})")
        if run.world_size > 1:
            return self._stop(run, firing, ONE_RANK_ALONE.format(action="no rollback"))
        service = run.checkpoints
        back = self._max_steps_back(run)
        restored = service.restore(run, before_step=spike, not_before=None if back is None
                                   else spike - back) if service is not None else None
        if restored is None and getattr(service, "cannot_restore", None):
            return self._stop(run, firing, f"no rollback: {service.cannot_restore}")
        if restored is None:
            within = "" if back is None else f" within {back} steps"
            return self._stop(run, firing, f"no checkpoint from{within} before step {spike} to "
                              "roll back to" + (
                                  " (checkpoints off)" if service is None else "" if back is None
                                  else " (an older one would be a restart, not a repair: "
                                  "monitor.actions.rollback.max_steps_back, checkpoint.every)"))
        name, step = restored
        self.last = (spike, step)
        self.count += 1
        lr = self._scale_lr(run)
        self.skip_left = s.skip_batches if self.skips_batches else 0
        skipped = (f"skipping the next {s.skip_batches} batches" if self.skips_batches
                   else "no batches skipped (the loop draws its own data: run.steps)")
        message = (f"rollback {self.count} of at most {s.max_rollbacks}: weights and optimizer "
                   f"back to step {step} ({name}), {firing.detected_at - step} steps before "
                   f"detection at step {firing.detected_at} (spike began at step {spike}); "
                   f"{skipped}{lr}")
        run.record_event(EventKind.MONITOR, "rollback", message, step=firing.detected_at,
                         rule=firing.rule, checkpoint=name, checkpoint_step=step,
                         spike_step=spike, skip_batches=self.skip_left, count=self.count)
        return message

    def _max_steps_back(self, run: RunContext) -> int | None:
        if self.settings.max_steps_back is not None:
            return self.settings.max_steps_back
        planned = run.state.planned_steps
        return None if planned is None else max(100, planned // 10)

    def _scale_lr(self, run: RunContext) -> str:
        factor = self.settings.lr_factor
        if factor == 1.0:
            return ""
        optimizers, schedulers = _optimizers_and_schedulers(run.objects, self.watched)
        before, after = _scale_lrs(optimizers, factor, 0.0)
        _scale_schedulers(schedulers, factor, 0.0)
        return f"; learning rate {before:.3g} -> {after:.3g}"

    def _stop(self, run: RunContext, firing: Firing, why: str) -> str:
        run.request_stop(StopReason.by_rule(firing.rule, f"{firing.finding.message}; {why}: "
                                            f"stopping. {resume_hint(firing.rule)}"))
        return f"{why}: stopping the run"

    def take_skip(self) -> bool:
        """The batch about to be trained is one the last rollback skips: it is counted off and
        True comes back (the batch wrapper of ``run.batches``, and the adapters, whose
        frameworks draw their own batches, each drop it their way)."""
        if not self.skip_left:
            return False
        self.skip_left -= 1
        return True

    def batches(self, iterator: Any) -> Any:
        """The batches of ``run.batches``, without the ones a rollback skips."""
        self.skips_batches = True
        return _SkippingBatches(iterator, self)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "skip_left": self.skip_left}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state.get("count", 0))
        self.skip_left = int(state.get("skip_left", 0))


class _SkippingBatches:
    """An epoch's iterator that drops ``action.skip_left`` batches; ``source`` is the loader's
    own iterator (failure capture reads the sample indices from it)."""

    def __init__(self, iterator: Any, action: RollbackAction) -> None:
        self.source = getattr(iterator, "source", iterator)
        self._iterator = iterator
        self._action = action

    def __iter__(self) -> _SkippingBatches:
        return self

    def __next__(self) -> Any:
        action = self._action
        while action.skip_left:
            next(self._iterator)  # at the epoch's end it raises first: the skip carries over
            action.skip_left -= 1
            # drawn from the epoch: its position counts it, or a resume later in the epoch
            # (which skips batches_in_epoch batches) would serve it again
            if action.state is not None:
                action.state.batches_in_epoch += 1
        return next(self._iterator)


ACTIONS: dict[str, type[Action]] = {cls.name: cls for cls in (
    StopAction, PruneAction, AlertAction, CaptureAction, ReduceLRAction, SkipAction,
    RollbackAction)}


def build_actions(settings: ActionSettings, watched: dict[int, Any] | None = None
                  ) -> dict[str, Action]:
    """The actions of a monitor. ``watched``: every object the run's ATTACH events showed (the
    monitor fills it), so that the learning-rate actions also reach optimizers an adapter
    watches (Lightning's, Hugging Face's) but never attaches: the framework saves those."""
    return {"stop": StopAction(), "prune": PruneAction(), "alert": AlertAction(),
            "capture": CaptureAction(),
            "reduce_lr": ReduceLRAction(settings.reduce_lr, watched),
            "skip": SkipAction(), "rollback": RollbackAction(settings.rollback, watched)}


def _optimizers_and_schedulers(objects: dict[str, Any], watched: dict[int, Any]
                               ) -> tuple[list[Any], list[Any]]:
    import torch

    values = list({id(o): o for o in [*objects.values(), *watched.values()]}.values())
    return ([o for o in values if isinstance(o, torch.optim.Optimizer)],
            [o for o in values if isinstance(o, torch.optim.lr_scheduler.LRScheduler)])


def _scale_lrs(optimizers: list[Any], factor: float, floor: float) -> tuple[float, float]:
    """Scale every group; returns the first group's learning rate before and after."""
    first: tuple[float, float] | None = None
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            old = float(group["lr"])
            new = max(old * factor, min(old, floor))
            _set_lr(group, new)
            if "initial_lr" in group:
                group["initial_lr"] = max(float(group["initial_lr"]) * factor, floor)
            first = first or (old, new)
    return first or (0.0, 0.0)


def _set_lr(group: dict[str, Any], value: float) -> None:
    if hasattr(group["lr"], "fill_"):  # a tensor lr (capturable optimizers) stays a tensor
        group["lr"].fill_(value)
    else:
        group["lr"] = value


def _scale_schedulers(schedulers: list[Any], factor: float, floor: float) -> None:
    for scheduler in schedulers:
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [max(lr * factor, floor) for lr in scheduler.base_lrs]
