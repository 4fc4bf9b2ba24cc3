"""StragglerWatch: the rank a torchrun job waits for, named with its host and its numbers.

In a synchronous step the slowest rank sets the pace, and it is the one that waits *least*:
the healthy ranks pile up their time inside the gradient all-reduce, waiting for it. So rank
0's own profile of such a job says "other 80%" and nothing about the straggler. What tells
the ranks apart is the time each spends *outside* collectives, so every rank measures that
about itself, and every ``profile.straggler.interval_s`` of training (30 s) the ranks pool
their medians on a step where every rank reads the stop agreement (``run.ranks_agreed``):
one ``all_gather`` of a few numbers per rank on prudent's gloo group, never a collective per
step. Rank 0 compares them (:func:`find_stragglers`) and records a ``straggler`` finding,
shown by ``prudent show``, ``prudent profile`` and the report like the profiler's findings.

What is counted, per step and rank (three handlers that read the clock and append):

* *outside collectives*: from the end of one backward pass to the start of the next
  (``AFTER_BACKWARD`` to ``BEFORE_BACKWARD``): the optimizer step, the code between steps
  (prudent's included), the wait for the next batch and the forward pass. The backward pass is
  left out whole: DDP's gradient all-reduce (FSDP's reduce-scatter) runs inside it, and that
  is where a healthy rank waits for the slowest;
* *data wait*: the loader's ``next()`` (``BATCH_LOADED``), part of the above, reported apart.

These are host wall times. They show a straggler that is slow on the host (its data path,
Python, a core shared with other processes, a rank that sleeps). On CUDA the host runs ahead
of the device: a rank whose *GPU* is slow makes the others wait where their host waits for the
device (a ``.item()``), which may be outside backward on every rank; telling those apart
needs CUDA events (the NVIDIA Resiliency Extension's GPU score), which prudent does not
record. DDP's forward broadcasts buffers (``broadcast_buffers``, BatchNorm statistics) from
rank 0: a rank waiting there counts that wait as its own. A loop without ``run.backward`` (an
adapter that emits no ``BEFORE_BACKWARD``) times nothing and is never judged. With gradient
accumulation the earlier micro-steps' passes count as outside (under ``no_sync`` they are).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from prudent.kernel.events import Component, EventKind
from prudent.launch.spec import host_name
from prudent.profile.diagnosis import Finding
from prudent.profile.settings import StragglerSettings

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["RankTimes", "Straggler", "StragglerWatch", "find_stragglers", "straggler_finding"]

clock = time.perf_counter
MAX_SAMPLES = 200_000  # per list, while no comparison comes (torch.distributed not initialised)
MAX_NAMED = 16  # stragglers listed in a finding's evidence


@dataclass(frozen=True)
class RankTimes:
    """One rank's medians since the last comparison (seconds; None: nothing was timed)."""

    rank: int
    host: str
    step: int
    busy_s: float | None  # per step, outside collectives (data wait included)
    wait_s: float | None  # per batch, in the loader's next()
    step_s: float | None  # wall time per step, this rank's clock
    num_steps: int  # steps timed outside collectives


@dataclass(frozen=True)
class Straggler:
    """A rank slower than the others: ``score`` is their median over its time (< 1)."""

    times: RankTimes
    others_busy_s: float
    others_wait_s: float | None
    score: float


def find_stragglers(reports: list[RankTimes], settings: StragglerSettings) -> list[Straggler]:
    """The ranks that hold the others back, slowest first.

    A rank is one when the median of the *other* ranks' time outside collectives is below
    ``relative_score`` of its own (NVRx compares to the fastest rank; the median of the others
    lets one unusually fast rank make no one a straggler), and its excess over them is at least
    ``min_excess_pct`` of the job's step time (a rank 0.3 ms slower in a 100 ms step costs the
    job nothing). Ranks with fewer than ``min_steps`` steps timed leave the comparison out.
    """
    timed = [r for r in reports if r.busy_s is not None]
    if len(timed) < 2 or any(r.num_steps < settings.min_steps for r in reports):
        return []
    steps = [r.step_s for r in reports if r.step_s]
    job_step_s = statistics.median(steps) if steps else 0.0
    found = [s for s in (_compare(r, timed) for r in timed)
             if s.score < settings.relative_score
             and s.times.busy_s - s.others_busy_s >= settings.min_excess_pct / 100 * job_step_s]
    return sorted(found, key=lambda s: -s.times.busy_s)  # type: ignore[operator]


def _compare(rank: RankTimes, timed: list[RankTimes]) -> Straggler:
    others = [r for r in timed if r.rank != rank.rank]
    busy = statistics.median(r.busy_s for r in others)  # type: ignore[type-var]
    waits = [r.wait_s for r in others if r.wait_s is not None]
    assert rank.busy_s is not None
    score = busy / rank.busy_s if rank.busy_s > 0 else 1.0
    return Straggler(rank, busy, statistics.median(waits) if waits else None, min(score, 1.0))


def straggler_finding(found: list[Straggler], reports: list[RankTimes]) -> Finding:
    """The ``straggler`` finding: the slowest rank, its host, its numbers against the others',
    and where to look (its data path when waiting for data is most of its excess)."""
    worst, times = found[0], found[0].times
    steps = [r.step_s for r in reports if r.step_s]
    step_s = statistics.median(steps) if steps else None
    others = "the other rank" if len(reports) == 2 else "the other ranks' median"
    also = "".join(f"; also rank {s.times.rank} on {s.times.host} ({_ms(s.times.busy_s)})"
                   for s in found[1:MAX_NAMED])
    message = (f"rank {times.rank} on {times.host} spends {_ms(times.busy_s)} per step outside "
               f"collectives (data wait {_ms(times.wait_s)}), {others} {_ms(worst.others_busy_s)}"
               f" (data wait {_ms(worst.others_wait_s)}), at step {times.step}: the whole job "
               f"runs at its pace ({_ms(step_s)} a step){also}. {_advice(worst)}")
    return Finding("straggler", message, {
        "rank": times.rank, "host": times.host, "busy_ms": _round_ms(times.busy_s),
        "wait_ms": _round_ms(times.wait_s),
        "others_busy_ms": _round_ms(worst.others_busy_s),
        "others_wait_ms": _round_ms(worst.others_wait_s), "score": round(worst.score, 3),
        "step_ms": _round_ms(step_s), "num_ranks": len(reports),
        "stragglers": [{"rank": s.times.rank, "host": s.times.host, "score": round(s.score, 3),
                        "busy_ms": _round_ms(s.times.busy_s), "wait_ms": _round_ms(s.times.wait_s)}
                       for s in found[:MAX_NAMED]]})


def _advice(straggler: Straggler) -> str:
    times = straggler.times
    excess = (times.busy_s or 0.0) - straggler.others_busy_s
    extra_wait = (times.wait_s or 0.0) - (straggler.others_wait_s or 0.0)
    if excess > 0 and extra_wait >= excess / 2:
        return (f"Most of it is waiting for data: check rank {times.rank}'s data path (its "
                "loader's workers, the disk or network it reads, its share of the data)")
    return (f"Check {times.host}: thermal throttling or a slower clock, a noisy neighbour or "
            f"other processes on its cores, or work only rank {times.rank} does between steps")


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.3g} ms"


def _round_ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1e3 * seconds, 3)


class StragglerWatch(Component):
    """Times this rank outside collectives; every ``interval_s`` the ranks compare (see the
    module's docstring for what is counted). Built only under torchrun, on every rank.

    A finding is recorded when a rank becomes a straggler, not again at every comparison
    while it stays one (a two-day job would repeat it every 30 s).
    """

    name = "straggler"

    def __init__(self, settings: StragglerSettings | None = None, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.settings = settings or StragglerSettings()
        self.quiet, self._stream = quiet, stream
        self.host = host_name()
        self.busy: list[float] = []  # seconds outside collectives, one per step
        self.waits: list[float] = []  # seconds in the loader's next(), one per batch
        self.findings: list[Finding] = []
        self.num_comparisons = 0  # those that judged (every rank had min_steps timed)
        self._backward_end: float | None = None
        self._next = 1  # the first step whose agreement compares (the same on every rank)
        self._last: tuple[int, float] | None = None  # step and clock of the last comparison
        self._flagged: set[int] = set()

    # the hot path: a clock read and an append ------------------------------------------------
    def on_batch_loaded(self, run: RunContext, batch: Any, wait_s: float) -> None:
        self.waits.append(wait_s)

    def on_before_backward(self, run: RunContext, loss: Any) -> None:
        end = self._backward_end
        if end is not None:
            self.busy.append(clock() - end)

    def on_after_backward(self, run: RunContext, loss: Any) -> None:
        self._backward_end = clock()

    # the comparison ---------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        self._last = (run.state.step, clock())

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        """Awake from the step a comparison is due until the next agreed step (``sleep_until``
        spares the steps in between any call)."""
        group = run.rank_group
        if not run.ranks_agreed or group is None:
            self._bound()
            return
        reports = group.all_gather(self._my_times(run, group.ranks.rank))
        self._next = run.state.step + self._steps_between(reports)
        if group.ranks.is_main:
            self._judge(run, reports)
        run.sleep_until(self, self._next)

    def _my_times(self, run: RunContext, rank: int) -> RankTimes:
        """This rank's medians since the last comparison (its lists start anew)."""
        step, now = run.state.step, clock()
        last_step, last_time = self._last or (step, now)
        self._last = (step, now)
        busy, waits, self.busy, self.waits = self.busy, self.waits, [], []
        return RankTimes(rank, self.host, step, _median(busy), _median(waits),
                         (now - last_time) / (step - last_step) if step > last_step else None,
                         len(busy))

    def _steps_between(self, reports: list[RankTimes]) -> int:
        """Steps until the next comparison: ``interval_s`` at the slowest clock any rank
        reported, and never fewer than ``min_steps`` (an interval shorter than that many
        steps would gather forever and judge never). Every rank computes it from the same
        gathered list: the same number."""
        step_s = max((r.step_s for r in reports if r.step_s), default=None)
        if step_s is None:
            return 1  # the first comparison: no clock yet, the next step has one
        return max(self.settings.min_steps, int(self.settings.interval_s / step_s))

    def _judge(self, run: RunContext, reports: list[RankTimes]) -> None:
        if any(r.num_steps < self.settings.min_steps for r in reports):
            return  # too few steps since the last comparison (the first one, as a rule)
        self.num_comparisons += 1
        found = find_stragglers(reports, self.settings)
        flagged = {s.times.rank for s in found}
        new, self._flagged = flagged - self._flagged, flagged
        if not new:
            return
        finding = straggler_finding(found, reports)
        self.findings.append(finding)
        run.record_event(EventKind.FINDING, finding.id, finding.message, **finding.evidence)
        if not self.quiet:
            print(f"prudent | {run.id} | straggler: {finding.message}",
                  file=self._stream or sys.stderr, flush=True)

    def _bound(self) -> None:
        """Comparisons that never come (torch.distributed never initialised) keep no more than
        ``MAX_SAMPLES`` timings."""
        for kept in (self.busy, self.waits):
            if len(kept) > MAX_SAMPLES:
                del kept[: MAX_SAMPLES // 2]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
