"""The events a run emits, and the base class of every component that listens to them.

The user's loop, and where each event fires::

    run = prudent.init(...)              START        (once the run is registered)
    run.attach(model=..., ...)             ATTACH       (objects to save; restore them now if resuming)
    with run:
        for epoch in run.epochs(n):
            for batch in run.batches(dl):  BATCH_LOADED (after the loader's next() returned)
                run.backward(loss)         AFTER_BACKWARD (gradients exist, optimizer not stepped)
                run.step(loss=loss)        STEP_END     (counters advanced, metrics buffered)
            run.log(val_acc=...)           LOG          (evaluation metrics, already floats)
                                           EPOCH_END    (when the loop asks for the next epoch)
        any component / signal            STOP_REQUESTED (a stop reason was set)
        run.capture(...) / a failing step CAPTURE_REQUESTED (write a failure bundle now)
                                           CHECKPOINT_TAKEN (the loop's part of a save is done)
                                           CHECKPOINT_SAVED (a checkpoint became durable)
    leaving ``with run:``                  END          (status known; last chance to write)

Components subscribe by overriding ``on_<event name>``; the run only calls the methods a
component overrides, so an idle event costs nothing. Components never call each other: what
they share goes through the run (its state, its store, ``run.request_stop``).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from prudent.run import Run

__all__ = ["Component", "Event"]


class Event(str, Enum):
    START = "start"
    ATTACH = "attach"
    BATCH_LOADED = "batch_loaded"
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


class Component:
    """A habit plugged into the run. Override only the ``on_<event>`` methods you need.

    Contract: handlers run on the training thread, so they must be cheap (a few microseconds
    on ``on_step_end``); slow work belongs on a background thread the component owns and
    stops in ``on_end``. A handler may call ``run.request_stop(reason)``; it must not raise
    to stop the run. ``state_dict``/``load_state_dict`` let a component's state ride in
    checkpoints.
    """

    name: ClassVar[str] = "component"
    main_rank_only: ClassVar[bool] = False  # under torchrun, only rank 0 gets this component

    def on_start(self, run: Run) -> None: ...

    def on_attach(self, run: Run, objects: dict[str, Any]) -> None: ...

    def on_batch_loaded(self, run: Run, batch: Any, wait_s: float) -> None: ...

    def on_after_backward(self, run: Run, loss: Any) -> None: ...

    def on_step_end(self, run: Run, metrics: dict[str, Any]) -> None: ...

    def on_log(self, run: Run, metrics: dict[str, float]) -> None: ...

    def on_epoch_end(self, run: Run, epoch: int) -> None: ...

    def on_checkpoint_taken(self, run: Run, step: int) -> None:
        """On the training thread, once a save's snapshot is taken (an asynchronous save goes
        on writing in the background; a synchronous one is already written)."""

    def on_checkpoint_saved(self, run: Run, path: str) -> None: ...

    def on_stop_requested(self, run: Run, reason: str, message: str) -> None: ...

    def on_capture_requested(self, run: Run, reason: str, message: str,
                             error: BaseException | None) -> None: ...

    def on_end(self, run: Run, status: str, stop_reason: str | None) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def overrides(self, event: Event) -> bool:
        """True when this component handles ``event`` (so the run must call it)."""
        mine = getattr(type(self), event.method_name, None)
        return mine is not getattr(Component, event.method_name)
