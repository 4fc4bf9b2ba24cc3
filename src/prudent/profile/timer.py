"""StepTimer: where the training thread's wall time goes, split at the run's events.

Each interval between two events is charged to exactly one category, so the categories add
up to the wall time from the first wait for data to the end of the run, and no second is
counted twice or lost:

* ``data``: inside the loader's ``next()`` (the kernel measures it and passes ``wait_s``);
* ``compute``: from a batch to ``run.step`` (forward, backward, optimizer, the user's code);
* ``eval``: from the last ``run.step`` to ``run.log`` (evaluation follows a step);
* ``checkpoint``: from the last event to the end of a save's snapshot (and write, when
  synchronous) on the training thread;
* ``other``: from ``run.step`` or ``run.log`` to the next wait for data (epoch boundaries,
  handlers of other components, the user's code after ``run.step``).

Why events and not timers around calls: the profiler sees only events. On a CPU it is not even
called per step: the kernel stamps each batch and step end (``LoopTimes``) and :meth:`replay`
sums a few hundred of them with list operations; on a GPU each call is float arithmetic and
two list appends. The outlier search runs once per :data:`CHUNK` steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from operator import le, lt, sub

__all__ = ["CATEGORIES", "CHUNK", "Outlier", "StepTimer"]

CATEGORIES = ("data", "compute", "checkpoint", "eval", "other")
CHUNK = 1024  # steps scanned for outliers at a time: bounded memory, an adaptive median
MAX_OUTLIERS = 10_000


@dataclass
class Outlier:
    """One step that took ``factor`` times the median of its neighbourhood or more."""

    step: int
    duration_s: float
    wait_s: float
    median_s: float


@dataclass
class _ChunkStats:
    num_steps: int
    median_s: float
    p90_s: float


@dataclass(slots=True)
class StepTimer:
    """Accumulates the split; methods take ``now`` (``time.perf_counter()``) from the caller.

    ``outlier_factor`` and ``warmup_steps`` decide which steps are kept as outliers.
    """

    outlier_factor: float = 3.0
    warmup_steps: int = 5
    data_s: float = 0.0
    compute_s: float = 0.0
    checkpoint_s: float = 0.0
    eval_s: float = 0.0
    other_s: float = 0.0
    setup_s: float = 0.0
    profiler_s: float = 0.0  # part of other_s: the profiler's own stalls (a trace written)
    num_steps: int = 0
    num_batches: int = 0  # waits for data timed (run.batches): none, and data is not measured
    num_samples: int = 0
    num_tokens: float = 0.0
    num_evals: int = 0
    num_checkpoints: int = 0
    # why each save was made: "periodic" (the first too), "epoch_end", "keep:best", "stop"
    checkpoint_reasons: dict[str, int] = field(default_factory=dict)
    excluding: bool = False  # steps under torch.profiler are slow on purpose: not outliers
    outliers: list[Outlier] = field(default_factory=list)
    num_outliers: int = 0
    outlier_excess_s: float = 0.0
    first_step: int = 0
    last_wait_s: float = 0.0  # the data wait of the step in progress (or just ended)
    _mark: float = 0.0
    _began: float | None = None
    _in_step: bool = False
    _cycle: float = 0.0
    _durations: list[float] = field(default_factory=list)
    _waits: list[float] = field(default_factory=list)
    _chunk_first: int = 1
    _chunks: list[_ChunkStats] = field(default_factory=list)

    # the hot path -------------------------------------------------------------------------
    def start(self, now: float) -> None:
        self._mark = now

    def number_steps_from(self, step: int) -> None:
        """Steps done before this process's first (a resumed run); call after the first step."""
        self.first_step = step
        self._chunk_first = step + 1

    def batch_loaded(self, now: float, wait_s: float, samples: int) -> None:
        began_waiting = now - wait_s
        gap = began_waiting - self._mark
        if self._began is None:  # everything before the first batch is setup
            self._began, self.setup_s, gap = began_waiting, gap, 0.0
        if self._in_step:  # gradient accumulation: the previous micro-batch's compute
            self.compute_s += gap
            self._cycle += gap + wait_s
            self.last_wait_s += wait_s
        else:
            self.other_s += gap
            self._cycle = gap + wait_s
            self.last_wait_s = wait_s
            self._in_step = True
        self.data_s += wait_s
        self.num_batches += 1
        self.num_samples += samples
        self._mark = now

    def step_end(self, now: float, tokens: float = 0.0, exclude: bool = False) -> float:
        """A step ended; returns its compute time (from its batch to now).

        ``exclude`` keeps it out of the outlier search (a step that waited for the device).
        """
        compute = now - self._mark
        self.compute_s += compute
        self.num_steps += 1
        self.num_tokens += tokens
        if self._began is None:
            self._began = self._mark
        skip = self.excluding or exclude
        if self._in_step:
            self._durations.append(-1.0 if skip else self._cycle + compute)
            self._waits.append(self.last_wait_s)
        else:  # no batch since the last step: the loop does not use run.batches
            self.last_wait_s = 0.0
            self._durations.append(-1.0 if skip else compute)
            self._waits.append(0.0)
        self._in_step = False
        self._mark = now
        if len(self._durations) >= CHUNK:
            self._scan(final=False)
        return compute

    def replay(self, loaded: list[float], ended: list[float]) -> None:
        """The kernel's stamps since the last call (see
        :class:`~prudent.kernel.loop_times.LoopTimes`:
        ``loaded`` flat (arrival, wait) pairs, ``ended`` step ends), as if each had been passed
        to :meth:`batch_loaded` and :meth:`step_end` in time order. The usual shape, one batch
        then its step, over and over, is summed with list operations (a few hundred steps
        cost what a few steps did one call each); any other goes event by event."""
        arrivals, waits = loaded[0::2], loaded[1::2]
        if (ended and len(arrivals) == len(ended) and not self._in_step and not self.excluding
                and self._began is not None and all(map(le, arrivals, ended))
                and all(map(lt, ended, arrivals[1:]))):
            previous = [self._mark, *ended[:-1]]
            self.other_s += math.fsum(map(sub, map(sub, arrivals, waits), previous))
            self.data_s += math.fsum(waits)
            self.num_batches += len(waits)
            self.compute_s += math.fsum(map(sub, ended, arrivals))
            self.num_steps += len(ended)
            self._durations += map(sub, ended, previous)  # wait + compute + the gap before
            self._waits += waits
            self.last_wait_s, self._mark = waits[-1], ended[-1]
            if len(self._durations) >= CHUNK:
                self._scan(final=False)
            return
        i, count = 0, len(loaded)
        for end in ended:
            while i < count and loaded[i] <= end:
                self.batch_loaded(loaded[i], loaded[i + 1], 0)
                i += 2
            self.step_end(end)
        while i < count:  # a batch whose step has not ended yet
            self.batch_loaded(loaded[i], loaded[i + 1], 0)
            i += 2

    # rare events --------------------------------------------------------------------------
    def logged(self, now: float) -> None:
        """``run.log``: evaluation since the last step (a log inside a step stays compute)."""
        if self._in_step:
            return
        self.eval_s += now - self._mark
        self.num_evals += 1
        self._mark = now

    def profiler_overhead(self, now: float) -> None:
        """The profiler's own work on the training thread since the last event (writing a
        torch.profiler trace): charged to ``other`` and to no step, so it is never an outlier
        blamed on the user's code."""
        self.other_s += now - self._mark
        self.profiler_s += now - self._mark
        self._mark = now

    def checkpoint_taken(self, now: float, reason: str | None = None) -> None:
        """The loop's part of a save is done: the time since the last event was checkpointing."""
        self.checkpoint_s += now - self._mark
        self.num_checkpoints += 1
        why = "stop" if (reason or "").startswith("stop:") else (reason or "periodic")
        self.checkpoint_reasons[why] = self.checkpoint_reasons.get(why, 0) + 1
        self._mark = now

    def finish(self, now: float) -> None:
        """The run ended: the last interval, and the outlier search over the last steps."""
        if self._began is None:
            self._began = self._mark
        gap = now - self._mark
        if self._in_step:
            self.compute_s += gap
        else:
            self.other_s += gap
        self._mark = now
        self._in_step = False
        self._scan(final=True)

    # results ------------------------------------------------------------------------------
    @property
    def total_s(self) -> float:
        return self.data_s + self.compute_s + self.checkpoint_s + self.eval_s + self.other_s

    def breakdown(self) -> dict[str, float]:
        return {name: getattr(self, f"{name}_s") for name in CATEGORIES}

    def step_time(self) -> dict[str, float] | None:
        """Median and 90th percentile step time (weighted over chunks), in seconds."""
        chunks = [c for c in self._chunks if c.num_steps]
        if not chunks:
            return None
        return {"median_s": _weighted_median([(c.median_s, c.num_steps) for c in chunks]),
                "p90_s": _weighted_median([(c.p90_s, c.num_steps) for c in chunks]),
                "num_steps": sum(c.num_steps for c in chunks)}

    def _scan(self, final: bool) -> None:
        first, durations, waits = self._chunk_first, self._durations, self._waits
        self._durations, self._waits = [], []
        self._chunk_first = first + len(durations)
        after_warmup = self.first_step + self.warmup_steps
        kept = [(first + i, d, waits[i]) for i, d in enumerate(durations)
                if d >= 0 and first + i > after_warmup]  # -1: a step under torch.profiler
        if not kept:
            return
        ordered = sorted(d for _, d, _ in kept)
        chunk = _ChunkStats(len(ordered), statistics.median(ordered), _quantile(ordered, 0.9))
        median = self._reference_median(chunk, final)
        self._chunks.append(chunk)
        limit = self.outlier_factor * median
        for step, duration, wait in kept:
            if duration >= limit and median > 0:
                self._add_outlier(Outlier(step, duration, wait, median))

    def _reference_median(self, chunk: _ChunkStats, final: bool) -> float:
        # a short last chunk is a poor reference: lean on the chunk before it
        if final and chunk.num_steps < 64 and self._chunks:
            return self._chunks[-1].median_s
        return chunk.median_s

    def _add_outlier(self, outlier: Outlier) -> None:
        self.num_outliers += 1
        self.outlier_excess_s += outlier.duration_s - outlier.median_s
        if len(self.outliers) < MAX_OUTLIERS:
            self.outliers.append(outlier)


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _weighted_median(pairs: list[tuple[float, int]]) -> float:
    pairs = sorted(pairs)
    half, seen = sum(n for _, n in pairs) / 2, 0
    for value, n in pairs:
        seen += n
        if seen >= half:
            return value
    return pairs[-1][0]
