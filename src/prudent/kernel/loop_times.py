"""LoopTimes: the loop's own timestamps, kept by the kernel at points it passes anyway.

When a batch arrived (and how long the loader's ``next()`` took) and when each optimizer step
ended are read once by the kernel, before any handler runs, and appended to flat lists. A
component that times the loop (the profiler) reads them in bulk every few hundred steps
instead of being called on every batch and every step: two list appends cost the loop a
fraction of what two handler calls did. The samples and tokens seen are running totals, fresh
for a reader on another thread (the profiler's system sampler).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TOKENS", "LoopTimes", "batch_size", "token_count"]

TOKENS = "tokens"  # run.step(tokens=n) counts tokens for tokens/s


class LoopTimes:
    """``loaded``: (arrival time, wait s) pairs, flat; ``ended``: step end times; both in
    ``time.perf_counter()`` seconds, oldest first, until a reader takes them (:meth:`take`)."""

    __slots__ = ("ended", "loaded", "samples", "steps", "tokens")

    def __init__(self) -> None:
        self.loaded: list[float] = []
        self.ended: list[float] = []
        self.steps = 0  # step ends noted, this process
        self.samples = 0  # in every batch that arrived, this process
        self.tokens = 0.0  # passed to run.step(tokens=...), this process

    def batch_loaded(self, now: float, wait_s: float, batch: Any) -> None:
        self.loaded += (now, wait_s)
        self.samples += batch_size(batch)

    def step_ended(self, now: float, metrics: dict[str, Any]) -> None:
        self.ended.append(now)
        self.steps += 1
        tokens = metrics.get(TOKENS) if metrics else None
        if tokens is not None:
            self.tokens += token_count(tokens)

    def take(self) -> tuple[list[float], list[float]]:
        """What was kept since the last call (``loaded``, ``ended``), and start anew."""
        loaded, ended = self.loaded, self.ended
        self.loaded, self.ended = [], []
        return loaded, ended


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (1 if it has none).

    Called on every batch, so the common shapes ((x, y) tuples, tensors) come first.
    """
    kind = type(batch)
    if kind is tuple or kind is list:
        if not batch:
            return 0
        first = batch[0]
        shape = getattr(first, "shape", None)  # one read: torch builds a new Size each time
        if shape is not None:
            return shape[0] if len(shape) else 1
        return batch_size(first) if isinstance(first, (tuple, list, dict)) else len(batch)
    if kind is dict or isinstance(batch, dict):
        return batch_size(next(iter(batch.values()))) if batch else 0
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return shape[0] if len(shape) else 1
    return 1


def token_count(value: Any) -> float:
    """A token count: a Python number costs nothing; a tensor on a GPU costs a sync."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
