"""How many steps a component may sleep through (``RunContext.sleep_until``) before something
it watches by the clock falls due: half of the steps the recent pace says fit, asked again
then, so a slower stretch still lands within a step or two of the due time."""

from __future__ import annotations

__all__ = ["StepPace", "steps_within"]


class StepPace:
    """The recent step time, from the (step, clock) readings of a handler that runs sparsely."""

    def __init__(self) -> None:
        self._seen: tuple[int, float] | None = None

    def seen(self, step: int, now: float) -> float | None:
        """Note a reading; the seconds a step took since the last one (None: not known yet)."""
        last, self._seen = self._seen, (step, now)
        if last is None or step <= last[0]:
            return None
        return (now - last[1]) / (step - last[0])


def steps_within(seconds: float, step_s: float | None) -> int:
    """Steps that may pass safely before ``seconds`` from now (0: look again next step)."""
    if step_s is None or step_s <= 0.0:
        return 0
    waits = 0.5 * seconds / step_s
    return 0 if waits < 2 else int(min(waits, 1e9))
