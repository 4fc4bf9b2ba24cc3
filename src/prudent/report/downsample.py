"""Metric series small enough to draw, with every extreme still visible.

A run's steps are cut into at most ``num_buckets`` equal step ranges and the database returns,
per metric and range, the count, the first and last step, the smallest and the largest value.
Those come from the store's ``metric_rollup`` (the same sums kept at write time per 16, 64,
256, ... 65536 steps: a million-point run reads a few thousand rows, its range width rounded up
to a multiple of the rollup's, at most a quarter wider), or, for a run written before the rollup existed or one
short enough to need finer ranges, from one aggregate query over the run's rows. A range
holding one point gives that point exactly; a range holding more gives two points, its minimum
and its maximum, so a spike or a dip is never averaged away (the min/max envelope that M4 and
Plotly's own resamplers draw). A run with fewer steps than buckets comes back exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from prudent.report.reader import ReadOnlyStore
from prudent.store.database import ROLLUP_WIDTHS, metric_rollup
from prudent.store.database import metrics as metrics_table

__all__ = ["DEFAULT_BUCKETS", "PROFILE_PREFIX", "Series", "envelope", "profile_timeline",
           "run_series"]

DEFAULT_BUCKETS = 1500
PROFILE_PREFIX = "profile/"  # the profiler's machine series (its sampler), not the model's
MAX_TIMELINE_POINTS = 600  # about a chart's width in pixels: more points only cost drawing

Series = dict[str, Any]  # {"name", "steps": [...], "values": [...], "count", "downsampled"}


def run_series(store: ReadOnlyStore, run_id: str, last_step: int,
               num_buckets: int = DEFAULT_BUCKETS) -> list[Series]:
    """Every metric of the run but the profiler's machine series (``profile/*``: drawn from
    :func:`profile_timeline`), each at most ``2 * num_buckets`` points, by name."""
    width = max(1, math.ceil((max(last_step, 1) + 1) / num_buckets))
    level = max((w for w in ROLLUP_WIDTHS if w <= width), default=None)
    if level is not None and store.rollup_covers(run_id):
        return _rolled_up_series(store, run_id, level, math.ceil(width / level) * level)
    m = metrics_table.c
    bucket = (m.step // width).label("bucket") if width > 1 else m.step.label("bucket")
    stmt = (sa.select(m.name, bucket, sa.func.count(), sa.func.min(m.step), sa.func.max(m.step),
                      sa.func.min(m.value), sa.func.max(m.value), sa.func.count(m.value))
            .where(m.run_id == run_id, ~m.name.startswith(PROFILE_PREFIX))
            .group_by(m.name, bucket).order_by(m.name, bucket))
    grouped: dict[str, list[Sequence[Any]]] = {}
    for row in store.read(stmt):
        grouped.setdefault(row[0], []).append(row[2:])
    return [envelope(name, rows) for name, rows in grouped.items()]


def _rolled_up_series(store: ReadOnlyStore, run_id: str, level: int, width: int
                      ) -> list[Series]:
    r = metric_rollup.c
    bucket = ((r.bucket * level) // width).label("bucket")
    stmt = (sa.select(r.name, bucket, sa.func.sum(r.num), sa.func.min(r.first_step),
                      sa.func.max(r.last_step), sa.func.min(r.low), sa.func.max(r.high),
                      sa.func.sum(r.num_values))
            .where(r.run_id == run_id, r.width == level, ~r.name.startswith(PROFILE_PREFIX))
            .group_by(r.name, bucket).order_by(r.name, bucket))
    grouped: dict[str, list[Sequence[Any]]] = {}
    for name, _, num, first, last, low, high, num_values in store.read(stmt):
        # PostgreSQL's sum() of integers is a bigint, SQLite's an int; either way a count
        grouped.setdefault(name, []).append((int(num), first, last, low, high, int(num_values)))
    return [envelope(name, rows) for name, rows in grouped.items()]


def profile_timeline(store: ReadOnlyStore, run_id: str, started_at: float,
                     max_points: int = MAX_TIMELINE_POINTS, last_step: int = 0
                     ) -> list[dict[str, Any]]:
    """The profiler's samples as the store has them (``profile/*`` metrics, one set every few
    seconds): flat dicts ``{"t": seconds since the run started, "step", "cpu_pct", ...}``,
    averaged over equal time buckets when there are more than ``max_points``. A run of
    ``last_step`` >= 16 x ``max_points`` steps is read from the rollup (its buckets of steps
    are then finer than the timeline's buckets of time), others from their rows. The local
    ``profile.json`` (the profiler's own timeline) is drawn as it is."""
    names = store.rollup_names(run_id)
    if names is not None and not any(n.startswith(PROFILE_PREFIX) for n in names):
        return []  # the run has no profiler series: no pass over its rows to find none
    level = max((w for w in ROLLUP_WIDTHS if w <= last_step // max_points), default=None)
    if names is not None and level is not None:
        r = metric_rollup.c
        mine = sa.and_(r.run_id == run_id, r.width == level, r.name.like(f"{PROFILE_PREFIX}%"))
        wall, name, step = r.wall, r.name, r.last_step
        mean = sa.func.sum(r.total) / sa.func.nullif(sa.func.sum(r.num_values), 0)
    else:
        m = metrics_table.c
        mine = sa.and_(m.run_id == run_id, m.name.like(f"{PROFILE_PREFIX}%"))
        wall, name, step, mean = m.wall, m.name, m.step, sa.func.avg(m.value)
    first, last = store.read(sa.select(sa.func.min(wall), sa.func.max(wall)).where(mine))[0]
    if first is None:
        return []
    width = max((last - first) / max_points, 1e-6)
    bucket = sa.cast((wall - first) / width, sa.Integer).label("bucket")
    stmt = (sa.select(bucket, name, mean, sa.func.max(wall), sa.func.max(step))
            .where(mine).group_by(bucket, name).order_by(bucket))
    samples: dict[int, dict[str, Any]] = {}
    for index, series, value, newest, at_step in store.read(stmt):
        sample = samples.setdefault(index, {"t": round(newest - started_at, 3), "step": at_step})
        sample[series.removeprefix(PROFILE_PREFIX)] = value
    return list(samples.values())


def envelope(name: str, buckets: Iterable[Sequence[Any]]) -> Series:
    """Points from bucket aggregates ``(count, first step, last step, min, max, finite count)``.

    A bucket with only missing values (NaN is stored as NULL) gives a gap (``None``) at its
    first step, so the line breaks where the metric did.
    """
    steps: list[int] = []
    values: list[float | None] = []
    total, reduced = 0, False
    for count, first, last, low, high, num_finite in buckets:
        total += count
        if not num_finite:
            steps.append(first)
            values.append(None)
        elif count == 1 or low == high:
            steps.append(first if count == 1 else last)
            values.append(_round(low))
        else:
            reduced = True
            previous = next((v for v in reversed(values) if v is not None), low)
            previous = previous if math.isfinite(previous) else 0.0
            pair = [(first, low), (last, high)]
            if abs(previous - high) < abs(previous - low):  # follow the line, not a zigzag
                pair = [(first, high), (last, low)]
            for step, value in pair:
                steps.append(step)
                values.append(_round(value))
    return {"name": name, "steps": steps, "values": values, "count": total,
            "downsampled": reduced}


def _round(value: float) -> float | None:
    """Seven significant digits: what a chart can show, and a third of the bytes of repr.
    Infinities (PostgreSQL keeps NaN too) are gaps: JSON has no number for them."""
    return float(f"{value:.7g}") if math.isfinite(value) else None
