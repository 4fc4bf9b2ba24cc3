"""MetricsRecorder: the component that puts ``run.step`` / ``run.log`` metrics in the store.

On the training thread it only appends references (tensors stay tensors, detached); every
``every_steps`` steps or ``every_s`` seconds it hands the batch to the store writer, whose
thread turns them into floats. So ``run.step(loss=loss)`` never waits for the device.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prudent.events import Component

if TYPE_CHECKING:
    from prudent.run import Run

__all__ = ["MetricsRecorder"]


class MetricsRecorder(Component):
    name = "metrics"
    main_rank_only = True

    def __init__(self, every_steps: int = 100, every_s: float = 0.5) -> None:
        self.every_steps = every_steps
        self.every_s = every_s
        self._pending: list[tuple[int, float, dict[str, Any]]] = []
        self._next_handoff = time.monotonic() + every_s

    def on_step_end(self, run: Run, metrics: dict[str, Any]) -> None:
        if not metrics:
            return
        self._pending.append((run.state.step, time.time(), _detached(run, metrics)))
        if len(self._pending) >= self.every_steps or time.monotonic() >= self._next_handoff:
            self._handoff(run)

    def on_log(self, run: Run, metrics: dict[str, float]) -> None:
        self._pending.append((run.state.step, time.time(), dict(metrics)))
        self._handoff(run)

    def on_end(self, run: Run, status: str, stop_reason: str | None) -> None:
        self._handoff(run)
        run.writer.flush()  # components after this one (the console's summary) see final values

    def _handoff(self, run: Run) -> None:
        if self._pending:
            run.writer.put_metrics(run.id, self._pending)
            self._pending = []
        self._next_handoff = time.monotonic() + self.every_s


def _detached(run: Run, metrics: dict[str, Any]) -> dict[str, Any]:
    """Numbers for the store: a CPU scalar is read now (most likely already read by the
    monitor or capture: free), a device tensor is detached and read by the writer's thread
    (keeping it attached would keep its autograd graph, and activations, alive)."""
    out = {}
    for name, value in metrics.items():
        value = run.host_scalar(value)
        out[name] = value.detach() if hasattr(value, "detach") else value
    return out
