"""The events a run emits, and the base class of every component that listens to them.

The user's loop, and where each event fires::

    run = prudent.init(...)              START        (once the run is registered)
    run.attach(model=..., ...)             ATTACH       (objects to save; restore them now if resuming)
    with run:
        for epoch in run.epochs(n):
            for batch in run.batches(dl):  BATCH_LOADED (after the loader's next() returned)
                run.backward(loss)         BEFORE_BACKWARD (the step's loss, no gradients yet)
                                           AFTER_BACKWARD (gradients exist, optimizer not stepped)
                run.step(loss=loss)        STEP_END     (counters advanced, metrics buffered)
            run.log(val_acc=...)           LOG          (evaluation metrics, already floats)
                                           EPOCH_END    (when the loop asks for the next epoch)
        any component / signal            STOP_REQUESTED (a stop reason was set)
        run.capture(...) / a failing step CAPTURE_REQUESTED (write a failure bundle now)
                                           CHECKPOINT_TAKEN (the loop's part of a save is done)
                                           CHECKPOINT_SAVED (a checkpoint became durable)
    leaving ``with run:``                  END          (status known; last chance to write)

A loop without epochs (``for it in run.steps(max_iters):``) fires the same events but
BATCH_LOADED and EPOCH_END; several ``run.backward`` before one ``run.step`` (gradient
accumulation) fire BEFORE_BACKWARD and AFTER_BACKWARD once, around the last micro-step, with
their summed loss. BEFORE_BACKWARD is where a component that needs only the loss reads it:
the loss was just computed, so reading it there costs less than after the backward pass has
filled the caches with gradients (adapters may not emit it: such a component falls back to
AFTER_BACKWARD, which every loop emits).

Components subscribe by overriding ``on_<event name>``; the run only calls the methods a
component overrides, so an idle event costs nothing. Handlers get the
:class:`~prudent.kernel.context.RunContext`, never the user's ``Run``. Components never call each
other: what they share goes through the context (its state, its store, ``request_stop``).

What a run writes to its record (the store's ``events`` table) is a different thing: a
``(kind, name)`` pair from :data:`RECORDED_EVENTS`, a message for a person and a payload for
code (a fact another module needs is read from the payload, never from the message).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["RECORDED_EVENTS", "Component", "Event", "EventKind"]


class Event(str, Enum):
    START = "start"
    ATTACH = "attach"
    BATCH_LOADED = "batch_loaded"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    STEP_END = "step_end"
    LOG = "log"
    EPOCH_END = "epoch_end"
    CHECKPOINT_TAKEN = "checkpoint_taken"
    CHECKPOINT_SAVED = "checkpoint_saved"
    STOP_REQUESTED = "stop_requested"
    CAPTURE_REQUESTED = "capture_requested"
    END = "end"

    @property
    def method_name(self) -> str:
        return f"on_{self.value}"


class EventKind(str, Enum):
    """The ``kind`` column of a recorded event."""

    LIFECYCLE = "lifecycle"
    SUPERVISOR = "supervisor"
    CHECKPOINT = "checkpoint"
    PREEMPTION = "preemption"
    COST = "cost"
    PROFILE = "profile"
    FINDING = "finding"  # name: the profile finding's id
    MONITOR = "monitor"
    RULE = "rule"  # name: the rule that fired
    CAPTURE = "capture"
    CAPTURE_REQUESTED = "capture_requested"  # name: the rule that asked
    STORE = "store"  # the run store itself (written by the store writer, not a component)
    CONFIG = "config"  # the user's hyperparameters (run.config)


# Every (kind, name) a run records; None: the name is a rule's name or a finding's id.
RECORDED_EVENTS: dict[EventKind, tuple[str, ...] | None] = {
    EventKind.LIFECYCLE: ("start", "stop_requested", "end", "rank_lost", "membership",
                          "healed", "not_committed", "unreplicated_model"),
    EventKind.SUPERVISOR: ("exit", "end", "relaunch", "preempted_while_starting", "end_cut"),
    EventKind.CHECKPOINT: ("skipped", "fresh_start", "resumed", "emergency_skipped",
                           "not_restored", "save_failed", "saved", "interval", "record_imported",
                           "record_lost", "not_finite", "restored", "rank_fresh",
                           "world_changed", "script_resumed"),
    EventKind.PREEMPTION: ("notice",),
    EventKind.COST: ("detect", "price", "meter", "limit"),
    EventKind.PROFILE: ("trace_failed", "trace", "trace_skipped", "summary"),
    EventKind.FINDING: None,
    EventKind.MONITOR: ("error", "rule_error", "stacks_not_written", "hard_exit", "webhook_failed",
                        "blind", "skipped_update", "rollback", "repaired", "best_kept",
                        "best_restored", "decision", "outlier_trained"),
    EventKind.RULE: None,
    EventKind.CAPTURE: ("skipped", "failed", "written"),
    EventKind.CAPTURE_REQUESTED: None,
    EventKind.STORE: ("outage",),
    EventKind.CONFIG: ("unread",),
}


class Component:
    """A habit plugged into the run. Override only the ``on_<event>`` methods you need.

    Contract: handlers run on the training thread, so they must be cheap (a few microseconds
    on ``on_step_end``); slow work belongs on a background thread the component owns and
    stops in ``on_end``. A handler may call ``ctx.request_stop(reason)``; it must not raise
    to stop the run. ``state_dict``/``load_state_dict`` let a component's state ride in
    checkpoints.
    """

    name: ClassVar[str] = "component"
    main_rank_only: ClassVar[bool] = False  # under torchrun, only rank 0 gets this component

    def on_start(self, ctx: RunContext) -> None: ...

    def on_attach(self, ctx: RunContext, objects: dict[str, Any]) -> None: ...

    def on_batch_loaded(self, ctx: RunContext, batch: Any, wait_s: float) -> None: ...

    def on_before_backward(self, ctx: RunContext, loss: Any) -> None: ...

    def on_after_backward(self, ctx: RunContext, loss: Any) -> None: ...

    def on_step_end(self, ctx: RunContext, metrics: dict[str, Any]) -> None: ...

    def on_log(self, ctx: RunContext, metrics: dict[str, float]) -> None: ...

    def on_epoch_end(self, ctx: RunContext, epoch: int) -> None: ...

    def on_checkpoint_taken(self, ctx: RunContext, step: int) -> None:
        """On the training thread, once a save's snapshot is taken (an asynchronous save goes
        on writing in the background; a synchronous one is already written)."""

    def on_checkpoint_saved(self, ctx: RunContext, path: str) -> None: ...

    def on_stop_requested(self, ctx: RunContext, reason: StopReason) -> None: ...

    def on_capture_requested(self, ctx: RunContext, reason: str, message: str,
                             error: BaseException | None) -> None: ...

    def on_end(self, ctx: RunContext, status: str, reason: StopReason | None) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def overrides(self, event: Event) -> bool:
        """True when this component handles ``event`` (so the run must call it)."""
        mine = getattr(type(self), event.method_name, None)
        return mine is not getattr(Component, event.method_name)
