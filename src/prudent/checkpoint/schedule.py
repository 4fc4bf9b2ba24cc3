"""When to save: every N steps, every T seconds, at epoch ends, or ``auto``.

``auto`` saves once after the first step (which proves that saving works and measures what a
save costs the loop), then every τ seconds, where τ minimises the expected time lost to
checkpointing plus re-doing work after an interruption (Daly 2006, the higher-order form of
Young's τ = √(2δM)): δ is the measured time the loop is blocked per save, M the mean time
between interruptions. τ is never shorter than twice the time a background write takes.

Epoch-end saves (on by default) come on top, but under ``auto`` only where they cost the loop
at most ~1% of the time since the last save: on epochs of a tenth of a second a save at each
one cost more than the steps (Lightning on the digits: 4 saves in 150 steps).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from prudent.kernel.pace import steps_within
from prudent.kernel.units import parse_duration_s, parse_interval

__all__ = ["SaveSchedule", "daly_interval_s"]

MIN_AUTO_INTERVAL_S = 5.0
EPOCH_END_COST_SHARE = 0.01  # under auto, an epoch-end save blocks the loop at most this share


def daly_interval_s(cost_s: float, mtbi_s: float) -> float:
    """Daly's optimum compute time between checkpoints (FGCS 22(3), eq. 37)."""
    if cost_s >= 2 * mtbi_s:
        return mtbi_s
    ratio = cost_s / (2 * mtbi_s)
    return math.sqrt(2 * cost_s * mtbi_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s


class SaveSchedule:
    def __init__(self, every: str, at_epoch_end: bool, mtbi: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kind, self.amount = parse_interval(every)
        self.at_epoch_end = at_epoch_end
        self.mtbi_s = parse_duration_s(mtbi)
        self.clock = clock
        self.cost_s: float | None = None  # blocked time per save, smoothed
        self.write_s = 0.0
        self.interval_s = self.amount if self.kind == "seconds" else None
        self._last_step = 0
        self._last_time = clock()
        self._num_saved = 0
        self._plan()

    def due_at_step(self, step: int) -> bool:
        """Asked after every step: two comparisons (the next step due, the next time due)."""
        return step >= self._due_step or (self._timed and self.clock() >= self._due_time)

    def steps_to_wait(self, step: int, step_s: float | None) -> int:
        """Steps that can pass before the next save could be due (0: ask again next step).

        Step-counted schedules know it exactly; a timed one from the recent step time
        (:func:`prudent.kernel.pace.steps_within`)."""
        waits = self._due_step - step
        if self._timed:
            waits = min(waits, steps_within(self._due_time - self.clock(), step_s))
        return 0 if waits < 2 else int(min(waits, 1e9))

    def _plan(self) -> None:
        """When the next save is due, worked out once per save or measurement."""
        kind, inf = self.kind, math.inf
        self._due_step: float = self._last_step + self.amount if kind == "steps" else inf
        # auto before any measurement: one save to measure, then wait for its result
        if kind == "auto" and self.interval_s is None and self._num_saved == 0:
            self._due_step = -inf
        self._timed = kind == "seconds" or (kind == "auto" and self.interval_s is not None)
        self._due_time = self._last_time + (self.interval_s or 0.0) if self._timed else inf

    def due_at_epoch_end(self, finished_epoch: int) -> bool:
        if self.kind == "epochs":
            return (finished_epoch + 1) % max(1, int(self.amount)) == 0
        if self.kind == "auto" and self.at_epoch_end and self.cost_s is not None:
            return self.clock() - self._last_time >= self.cost_s / EPOCH_END_COST_SHARE
        return self.at_epoch_end

    def saved(self, step: int) -> None:
        """A save was taken at ``step`` (now)."""
        self._last_step, self._last_time = step, self.clock()
        self._num_saved += 1
        self._plan()

    def measured(self, stall_s: float, write_s: float) -> str | None:
        """Feed a finished save's costs; returns an explanation when the auto interval changes."""
        self.cost_s = stall_s if self.cost_s is None else 0.7 * self.cost_s + 0.3 * stall_s
        self.write_s = write_s
        if self.kind != "auto":
            return None
        daly = daly_interval_s(max(self.cost_s, 1e-4), self.mtbi_s)
        chosen = max(daly, 2 * write_s, MIN_AUTO_INTERVAL_S)
        previous, self.interval_s = self.interval_s, chosen
        self._plan()
        if previous is not None and abs(chosen - previous) <= 0.25 * previous:
            return None
        return (f"checkpoint every {chosen:.1f} s: Daly interval {daly:.1f} s for a measured "
                f"stall of {self.cost_s * 1000:.1f} ms per save and a mean time between "
                f"interruptions of {self.mtbi_s / 3600:.3g} h (floor: 2 x write time "
                f"{write_s:.2f} s, {MIN_AUTO_INTERVAL_S:.0f} s); expected work lost per "
                f"interruption about {chosen / 2:.1f} s")
