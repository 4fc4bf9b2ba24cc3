"""What a rule firing does: stop, reduce_lr, alert, capture, prune.

Whatever the action, every firing is announced the same way first (an event in the run's
store, a line on stderr, the webhook if one is set); the action is what happens next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from prudent.events import EventKind
from prudent.monitor.base import Finding
from prudent.monitor.settings import ActionSettings, ReduceLRSettings
from prudent.stop import StopReason

if TYPE_CHECKING:
    from prudent.context import RunContext

__all__ = ["ACTIONS", "Action", "AlertAction", "CaptureAction", "Firing", "PruneAction",
           "ReduceLRAction", "StopAction", "build_actions"]


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
        run.request_stop(StopReason.by_rule(firing.rule, firing.finding.message))
        return "stopping the run"


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


class ReduceLRAction(Action):
    """Multiply the learning rate of every attached optimizer's param groups by ``factor``
    (never below ``min_lr``), and the ``base_lrs`` of attached LR schedulers so the schedule
    does not undo it; then ignore requests for ``cooldown_steps``."""

    name = "reduce_lr"

    def __init__(self, settings: ReduceLRSettings | None = None) -> None:
        self.settings = settings or ReduceLRSettings()
        self.last_step: int | None = None

    def apply(self, run: RunContext, firing: Firing) -> str:
        s, step = self.settings, firing.detected_at
        if self.last_step is not None and step - self.last_step < s.cooldown_steps:
            return f"reduce_lr in cooldown (reduced at step {self.last_step})"
        optimizers, schedulers = _optimizers_and_schedulers(run.objects)
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


ACTIONS: dict[str, type[Action]] = {cls.name: cls for cls in (
    StopAction, PruneAction, AlertAction, CaptureAction, ReduceLRAction)}


def build_actions(settings: ActionSettings) -> dict[str, Action]:
    return {"stop": StopAction(), "prune": PruneAction(), "alert": AlertAction(),
            "capture": CaptureAction(), "reduce_lr": ReduceLRAction(settings.reduce_lr)}


def _optimizers_and_schedulers(objects: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    import torch

    values = list(objects.values())
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
