"""MetricsRecorder: the component that puts ``run.step`` / ``run.log`` metrics in the store.

On the training thread it only appends references (tensors stay tensors, detached); every
``every_steps`` steps or ``every_s`` seconds it hands the batch to the store writer, whose
thread turns them into floats. So ``run.step(loss=loss)`` never waits for the device.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prudent.kernel.events import Component

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["MetricsRecorder"]


class MetricsRecorder(Component):
    name = "metrics"
    main_rank_only = True

    def __init__(self, every_steps: int = 100, every_s: float = 0.5) -> None:
        self.every_steps = every_steps
        self.every_s = every_s
        self._pending: list[tuple[int, float, dict[str, Any]]] = []
        self._next_handoff = time.time() + every_s  # the clock each row is stamped with

    def on_start(self, run: RunContext) -> None:
        run.before_checkpoint.append(self._handoff)  # a checkpoint waits for these rows

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        if not metrics:
            return
        now = time.time()  # read once: the row's stamp and the hand-off clock
        pending = self._pending
        pending.append((run.state.step, now, _detached(run, metrics)))
        if len(pending) >= self.every_steps or now >= self._next_handoff:
            self._handoff(run)

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        self._pending.append((run.state.step, time.time(), dict(metrics)))
        self._handoff(run)

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        self._handoff(run)
        run.writer.flush()  # components after this one (the console's summary) see final values

    def _handoff(self, run: RunContext) -> None:
        if self._pending:
            run.writer.put_metrics(run.id, self._pending)
            self._pending = []
        self._next_handoff = time.time() + self.every_s


def _detached(run: RunContext, metrics: dict[str, Any]) -> dict[str, Any]:
    """Numbers for the store: a CPU scalar is read now (most likely already read by the
    monitor or capture: free), a device tensor is detached and read by the writer's thread
    (keeping it attached would keep its autograd graph, and activations, alive)."""
    out = {}
    for name, value in metrics.items():
        value = run.host_scalar(value)
        # a float first: hasattr() on one raises and catches an AttributeError inside
        out[name] = value if value.__class__ is float or not hasattr(value, "detach") \
            else value.detach()
    return out
