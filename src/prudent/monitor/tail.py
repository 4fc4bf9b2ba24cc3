"""The outliers a run keeps meeting, told apart from the ones that are new.

A skipped update repairs a batch that would harm the weights: a corrupted batch, a bad shard,
the first step of an explosion. Such batches are rare and gone once passed. A model that has
learnt most of a small dataset over several epochs meets its few hard samples again and again
instead: each lifts its batch's loss (and gradient norm) hundreds of standard deviations above
the moving mean. The digits MLP at a loss of 0.0003 meets one at 0.15-0.2 every ~50 steps.
Skipping those updates keeps the hard samples unlearnt, so they come back as outliers for
ever: 74 of 4,000 updates were skipped in a healthy run.

Such outliers are the data's own tail. They recur, spread over many windows, at a level that
does not grow. An outlier is one of them when it is no higher than :data:`TAIL_FACTOR` x the
highest of at least :data:`TAIL_LEAST` earlier ones that were seen more than one ``span``
before it, spread over more than one span, within the last :data:`TAIL_SPANS` spans. Such an
outlier is trained, not skipped. A corrupted batch far above the tail is still new. So is a
burst, whose outliers all fall within one span.

The outliers seen are kept as a deque of ``(step, value)`` pairs on the rule that judges
them. It is a plain list in its checkpoint, so a resumed run decides as the uninterrupted one.
"""

from __future__ import annotations

from collections import deque

__all__ = ["TAIL_FACTOR", "TAIL_LEAST", "TAIL_SPANS", "describe_tail", "in_tail",
           "new_outliers", "note_outlier"]

TAIL_FACTOR = 2.0  # an outlier up to this multiple of the tail's highest is one of it
TAIL_LEAST = 3  # earlier outliers, older than one span, that make a tail
TAIL_SPANS = 8  # the tail is looked for over this many spans before the step
_KEPT = 64  # outliers remembered (a budget of skips per span is 4-10)


def new_outliers() -> deque[tuple[int, float]]:
    return deque(maxlen=_KEPT)


def _earlier(outliers: deque[tuple[int, float]], step: int, span: int) -> list[tuple[int, float]]:
    """The outliers older than one span before ``step`` and within the tail's horizon."""
    first, last = step - TAIL_SPANS * span, step - span
    return [(s, v) for s, v in outliers if first <= s < last]


def in_tail(outliers: deque[tuple[int, float]], step: int, value: float, span: int) -> bool:
    """``value`` at ``step`` is one of the outliers the run keeps meeting (see the module)."""
    if len(outliers) < TAIL_LEAST:
        return False
    earlier = _earlier(outliers, step, span)
    if len(earlier) < TAIL_LEAST or earlier[-1][0] - earlier[0][0] <= span:
        return False
    return value <= TAIL_FACTOR * max(v for _, v in earlier)


def note_outlier(outliers: deque[tuple[int, float]], step: int, value: float) -> None:
    """Remember an outlier seen at ``step``, skipped or trained (a resumed run sees a step
    again: noted once)."""
    while outliers and outliers[-1][0] >= step:
        outliers.pop()
    outliers.append((step, value))


def describe_tail(outliers: deque[tuple[int, float]], step: int, span: int, what: str) -> str:
    """Why an outlier at ``step`` was trained: the tail it belongs to, in a sentence."""
    earlier = _earlier(outliers, step, span)
    highest = max(v for _, v in earlier)
    return (f"{len(earlier)} outliers of the {what} since step {earlier[0][0]}, up to "
            f"{highest:.4g}, spread over {earlier[-1][0] - earlier[0][0]} steps: the {what} has "
            "a heavy tail here (hard or mislabelled samples met again each epoch), so an "
            f"outlier no higher than {TAIL_FACTOR:g}x those is trained; skipping it would keep "
            "it unlearnt")
