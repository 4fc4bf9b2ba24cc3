"""StepValues: one metric of ``run.step`` at every step, kept by the kernel for a reader.

The monitor needs each step's loss, but only looks at it every few dozen steps (a rule check,
a layer sample) or when the kernel's loss watch flags one (a NaN, a jump, an outlier to skip).
Calling its handler on every step to append one number cost the loop a few microseconds; the
kernel appending it to a flat list before any handler runs costs a fraction of one, and the
monitor sleeps through the steps in between (``RunContext.sleep_until``) and takes them in
bulk. A value is kept as the host number when reading it costs no wait (a CPU tensor, read
once for every component: ``host_scalar``), detached when it lives on a device (the graph of a
step must not outlive it), as passed otherwise (None when the step had no such metric).
"""

from __future__ import annotations

from typing import Any

__all__ = ["StepValues"]


class StepValues:
    """``steps`` and ``values``: the step counter after each step and the metric ``key``'s value
    at it, oldest first, until the reader takes them (:meth:`take`)."""

    __slots__ = ("key", "steps", "values")

    def __init__(self, key: str) -> None:
        self.key = key
        self.steps: list[int] = []
        self.values: list[Any] = []

    def take(self) -> tuple[list[int], list[Any]]:
        """What was kept since the last call (``steps``, ``values``), and start anew."""
        steps, values = self.steps, self.values
        self.steps, self.values = [], []
        return steps, values
