"""Findings: what a run's profile says to change, each with a stable id and its numbers.

A finding names a bottleneck, the evidence (numbers, so anyone can check it) and a
recommendation in plain words. The thresholds start from what other tools use, see
``/work/shared/research/monitoring-debug-profiling.md``: TensorFlow calls a run "highly
input-bound" at 20% input time; SageMaker's LowGPUUtilization fires below a p95 of 70% and
its CPUBottleneck at a CPU above 90%. Each rule is a function ``(facts, thresholds) ->
Finding | None``; the order of :data:`RULES` matters only for ``low_gpu_utilization``, which
fires when no more specific finding explains an idle GPU.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RULES", "Facts", "Finding", "Thresholds", "diagnose"]


class Thresholds(BaseModel):
    """``profile.thresholds:`` in prudent.yaml. Percentages are of the training wall time."""

    model_config = ConfigDict(extra="forbid")

    min_steps: int = Field(20, ge=1, description="Fewer steps than this: too short to diagnose.")
    input_bound_pct: float = Field(20.0, gt=0, le=100, description="input_bound when waiting for "
                                   "data takes this share of step time (TensorFlow: 20%).")
    low_gpu_util_pct: float = Field(70.0, gt=0, le=100, description="low_gpu_utilization when the "
                                    "training GPU's median utilisation is below this.")
    cpu_bound_cpu_pct: float = Field(90.0, gt=0, description="cpu_bound when, with the GPU "
                                     "under-used, the process keeps this % of a core busy.")
    outlier_factor: float = Field(3.0, gt=1, description="A step is an outlier at this many times "
                                  "the median step.")
    outlier_min_count: int = Field(3, ge=1, description="step_outliers needs this many outliers.")
    outlier_min_share_pct: float = Field(5.0, ge=0, le=100, description="... and their time beyond "
                                         "the median must be this share of training time.")
    memory_growth_mb: float = Field(100.0, gt=0, description="memory_growth when memory grows "
                                    "steadily by this many MB after warm-up ...")
    memory_growth_pct: float = Field(10.0, ge=0, description="... and by this % of where it was.")
    checkpoint_overhead_pct: float = Field(5.0, gt=0, le=100, description="checkpoint_overhead "
                                           "when saving on the training thread takes this share.")
    eval_overhead_pct: float = Field(15.0, gt=0, le=100, description="eval_overhead when "
                                     "evaluation takes this share of training time.")
    small_batch_memory_pct: float = Field(50.0, gt=0, le=100, description="small_batch when the "
                                          "peak device memory PyTorch reserves is below this %.")


@dataclass
class Finding:
    """``id`` is stable (scripts and tests match on it); ``message`` is for people."""

    id: str
    message: str
    evidence: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "message": self.message, "evidence": self.evidence}


@dataclass
class Facts:
    """What the rules read: the step timer's totals and the system sampler's timeline."""

    num_steps: int
    breakdown: dict[str, float]  # seconds per category, see timer.CATEGORIES
    step_median_s: float | None = None
    num_evals: int = 0
    num_checkpoints: int = 0
    checkpoint_reasons: dict[str, int] = field(default_factory=dict)  # see timer.StepTimer
    outliers: Sequence[Any] = ()  # timer.Outlier: step, duration_s, wait_s, median_s
    num_outliers: int = 0
    outlier_excess_s: float = 0.0
    batches_per_epoch: int | None = None
    device: str = "cpu"
    gpu_index: int | None = None  # the training GPU in each sample's "gpus" list
    device_total_mb: float | None = None
    device_peak_reserved_mb: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(self.breakdown.values())

    @property
    def step_s(self) -> float:
        """Time in steps proper: waiting for data, computing, and the gaps between steps."""
        b = self.breakdown
        return b["data"] + b["compute"] + b["other"]

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def series(self, key: str, skip: float = 0.2) -> list[float]:
        """A sampled value over the run, without its first ``skip`` share (warm-up)."""
        values = [s[key] for s in self.samples if s.get(key) is not None]
        return values[int(len(values) * skip):]

    def gpu_util(self) -> list[float]:
        if self.gpu_index is None:
            return []
        values = [s["gpus"][self.gpu_index].get("util_pct") for s in self.samples
                  if len(s.get("gpus", ())) > self.gpu_index]
        values = [v for v in values if v is not None]
        return values[int(len(values) * 0.2):]


Rule = Callable[[Facts, Thresholds], "Finding | None"]


def diagnose(facts: Facts, thresholds: Thresholds | None = None) -> list[Finding]:
    """Every finding that fires, most specific first; none for a run too short to tell."""
    thresholds = thresholds or Thresholds()
    if facts.num_steps < thresholds.min_steps or facts.total_s <= 0:
        return []
    found: list[Finding] = []
    for rule in RULES:
        if rule is low_gpu_utilization and any(f.id in ("input_bound", "cpu_bound") for f in found):
            continue  # the idle GPU is already explained
        finding = rule(facts, thresholds)
        if finding is not None:
            found.append(finding)
    return found


# the rules ----------------------------------------------------------------------------------
def input_bound(f: Facts, t: Thresholds) -> Finding | None:
    pct = _pct(f.breakdown["data"], f.step_s)
    if pct < t.input_bound_pct:
        return None
    wait_ms, step_ms = _ms(f.breakdown["data"] / f.num_steps), _ms(f.step_s / f.num_steps)
    where = "GPU" if f.on_gpu else "model"
    return Finding("input_bound", (
        f"waiting for data took {pct:.0f}% of step time ({wait_ms:.1f} ms of {step_ms:.1f} ms a "
        f"step; threshold {t.input_bound_pct:g}%): the {where} idles while the loader works. Give "
        "the DataLoader num_workers (about one per CPU core), persistent_workers=True and "
        f"prefetch_factor{', pin_memory=True' if f.on_gpu else ''}; or preprocess and cache the "
        "data once instead of in every epoch."),
        {"data_pct": round(pct, 1), "data_ms_per_step": round(wait_ms, 3),
         "step_ms": round(step_ms, 3), "threshold_pct": t.input_bound_pct})


def cpu_bound(f: Facts, t: Thresholds) -> Finding | None:
    util, cpu = f.gpu_util(), f.series("cpu_pct")
    if not f.on_gpu or len(util) < 3 or len(cpu) < 3:
        return None
    util_median, cpu_median = statistics.median(util), statistics.median(cpu)
    if util_median >= t.low_gpu_util_pct or cpu_median < t.cpu_bound_cpu_pct:
        return None
    return Finding("cpu_bound", (
        f"the GPU was busy {util_median:.0f}% of the time while the training process kept "
        f"{cpu_median:.0f}% of a CPU core busy (thresholds: GPU < {t.low_gpu_util_pct:g}%, CPU >= "
        f"{t.cpu_bound_cpu_pct:g}%): Python cannot issue work fast enough. Move preprocessing "
        "into DataLoader workers or onto the GPU, avoid per-step .item()/.cpu() calls, raise the "
        "batch size, and try torch.compile (or CUDA graphs) to cut launch overhead."),
        {"gpu_util_median_pct": round(util_median, 1),
         "process_cpu_median_pct": round(cpu_median, 1), "num_samples": len(util)})


def low_gpu_utilization(f: Facts, t: Thresholds) -> Finding | None:
    util = f.gpu_util()
    if not f.on_gpu or len(util) < 3:
        return None
    median, p95 = statistics.median(util), _quantile(util, 0.95)
    if median >= t.low_gpu_util_pct:
        return None
    return Finding("low_gpu_utilization", (
        f"the training GPU was busy a median {median:.0f}% of the time (p95 {p95:.0f}%; threshold "
        f"{t.low_gpu_util_pct:g}%) although neither data nor the CPU holds it back: you pay for an "
        "idle accelerator. Raise the batch size, use mixed precision (bf16) and torch.compile, "
        "look for synchronisations in the loop (.item(), .cpu(), printing tensors), or move to a "
        "smaller, cheaper GPU."),
        {"gpu_util_median_pct": round(median, 1), "gpu_util_p95_pct": round(p95, 1),
         "num_samples": len(util), "threshold_pct": t.low_gpu_util_pct})


def step_outliers(f: Facts, t: Thresholds) -> Finding | None:
    share = _pct(f.outlier_excess_s, f.step_s)
    if f.num_outliers < t.outlier_min_count or share < t.outlier_min_share_pct or not f.outliers:
        return None
    steps = [o.step for o in f.outliers]
    period = _period(steps)
    median_ms = _ms(statistics.median(o.median_s for o in f.outliers))
    worst_ms = _ms(max(o.duration_s for o in f.outliers))
    in_data = _pct(sum(o.wait_s for o in f.outliers), sum(o.duration_s for o in f.outliers))
    when = f"every {period} steps" if period else "irregularly"
    listed = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
    return Finding("step_outliers", (
        f"{f.num_outliers} of {f.num_steps} steps took {t.outlier_factor:g}x the median step "
        f"({median_ms:.1f} ms) or more, up to {worst_ms:.0f} ms, {when} (steps {listed}), "
        f"costing {share:.0f}% of step time, {_where(in_data)}. "
        f"{_outlier_advice(period, f.batches_per_epoch, in_data)}"),
        {"num_outliers": f.num_outliers, "num_steps": f.num_steps, "period_steps": period,
         "steps": steps[:50], "median_ms": round(median_ms, 3), "max_ms": round(worst_ms, 3),
         "share_pct": round(share, 1), "in_data_pct": round(in_data, 1),
         "factor": t.outlier_factor})


def memory_growth(f: Facts, t: Thresholds) -> Finding | None:
    for key, what in (("rss_mb", "process memory (RSS)"),
                      ("device_allocated_mb", "GPU memory allocated by PyTorch")):
        growth = _steady_growth(f.samples, key)
        if growth is None:
            continue
        start, end, per_min = growth
        if end - start >= t.memory_growth_mb and end - start >= start * t.memory_growth_pct / 100:
            return Finding("memory_growth", (
                f"{what} grew steadily from {start:.0f} MB to {end:.0f} MB (+{end - start:.0f} MB, "
                f"{per_min:.0f} MB a minute) and was still growing at the end: a leak that will "
                "end in an out-of-memory crash. Look for tensors kept across steps: a list of "
                "losses or outputs (append loss.item(), not loss), tensors stored with their "
                "graph (use .detach()), caches that never evict."),
                {"series": key, "start_mb": round(start, 1), "end_mb": round(end, 1),
                 "growth_mb": round(end - start, 1), "mb_per_min": round(per_min, 1),
                 "threshold_mb": t.memory_growth_mb})
    return None


CHECKPOINT_REASONS = {"periodic": "on schedule", "epoch_end": "at an epoch's end",
                      "keep:best": "early stopping's best", "stop": "at the stop"}


def checkpoint_overhead(f: Facts, t: Thresholds) -> Finding | None:
    """Saves that cost too much of the run, with advice for what made them: the schedule (save
    less often) or early stopping's best, kept at each better evaluation (which no interval
    changes)."""
    reasons = f.checkpoint_reasons or {"periodic": f.num_checkpoints}
    kept = sum(n for why, n in reasons.items() if why.startswith("keep:"))
    scheduled = reasons.get("periodic", 0) + reasons.get("epoch_end", 0)
    why = ", ".join(f"{n} {CHECKPOINT_REASONS.get(r, r)}" for r, n in
                    sorted(reasons.items(), key=lambda item: -item[1]))
    head = ("checkpoint saving took {pct:.0f}% of training time ({n} save{s}: " + why
            + "; {each:.0f} ms each on the training thread; threshold {limit:g}%): ")
    if kept > scheduled:
        finding = _overhead(f, t.checkpoint_overhead_pct, "checkpoint", f.num_checkpoints, head + (
            "most are early stopping's best, one at each better evaluation, which no interval "
            "changes: evaluate less often, or set monitor.rules.early_stopping.restore_best: "
            "false (no checkpoint is kept for the best)."), scheduled or 1)
    else:
        finding = _overhead(f, t.checkpoint_overhead_pct, "checkpoint", f.num_checkpoints, head + (
            "save every {every} steps or more (now every {now:g}: checkpoint.every) to bring it "
            "near {target:g}%."), scheduled or 1)
    if finding is not None:
        finding.evidence["reasons"] = dict(reasons)
    return finding


MIN_EVALS = 3  # one evaluation's cost is mostly warm-up, and its spacing is unknown


def eval_overhead(f: Facts, t: Thresholds) -> Finding | None:
    if f.num_evals < MIN_EVALS:
        return None
    return _overhead(f, t.eval_overhead_pct, "eval", f.num_evals, (
        "evaluation took {pct:.0f}% of training time ({n} evaluation{s}, {each:.0f} ms each; "
        "threshold {limit:g}%): evaluate every {every} steps or more (now every {now:g}) to "
        "bring it near {target:g}%, or on a smaller validation subset."))


def small_batch(f: Facts, t: Thresholds) -> Finding | None:
    total, peak = f.device_total_mb, f.device_peak_reserved_mb
    if not f.on_gpu or not total or peak is None:
        return None
    pct, util = _pct(peak, total), f.gpu_util()
    if pct >= t.small_batch_memory_pct or (util and statistics.median(util) >= 90):
        return None
    room = max(2, int(total * 0.8 // max(peak, 1.0)))
    return Finding("small_batch", (
        f"PyTorch reserved at most {peak:.0f} MB of the GPU's {total:.0f} MB ({pct:.0f}%; "
        f"threshold {t.small_batch_memory_pct:g}%): the batch could be about {room}x larger. "
        "Raise the batch size (and scale the learning rate), or pick a GPU with less memory."),
        {"peak_reserved_mb": round(peak, 1), "device_total_mb": round(total, 1),
         "memory_pct": round(pct, 1), "headroom_factor": room})


RULES: tuple[Rule, ...] = (input_bound, cpu_bound, low_gpu_utilization, step_outliers,
                           memory_growth, checkpoint_overhead, eval_overhead, small_batch)


# helpers ------------------------------------------------------------------------------------
def _overhead(f: Facts, limit: float, category: str, count: int, text: str,
              spaced: int | None = None) -> Finding | None:
    """``spaced``: how many of the ``count`` an interval spaces (the rest come for other
    reasons): the steps between them now."""
    spent, total = f.breakdown[category], f.total_s
    pct = _pct(spent, total)
    if pct < limit or count == 0:
        return None
    each = spent / count
    per_step = f.step_s / max(f.num_steps, 1)
    now = f.num_steps / (spaced or count)
    target = limit / 2
    every = max(int(now) + 1, round(each * (1 - target / 100) / (target / 100 * per_step)))
    message = text.format(pct=pct, n=count, s="" if count == 1 else "s", each=_ms(each),
                          limit=limit, every=every, now=round(now, 1), target=target)
    return Finding(f"{category}_overhead", message, {
        f"{category}_pct": round(pct, 1), "count": count, "mean_ms": round(_ms(each), 3),
        "steps_between": round(now, 1), "suggested_every_steps": every, "threshold_pct": limit})


def _steady_growth(samples: list[dict[str, Any]], key: str) -> tuple[float, float, float] | None:
    """(start MB, end MB, MB per minute) when the series grows to the end, else None."""
    # setup (building the model, loading data) is not a leak: from the first step on, less
    # the first fifth of training (optimizer state, allocator caches)
    points = [(s["t"], s[key]) for s in samples if s.get(key) is not None and s.get("step")]
    points = points[int(len(points) * 0.2):]
    if len(points) < 6:
        return None
    third = len(points) // 3
    start = statistics.median(v for _, v in points[:3])
    end = statistics.median(v for _, v in points[-3:])
    span = points[-1][0] - points[0][0]
    tail_span = points[-1][0] - points[-third - 1][0]
    if end <= start or span <= 0 or tail_span <= 0:
        return None
    rate, tail_rate = (end - start) / span, (points[-1][1] - points[-third - 1][1]) / tail_span
    if tail_rate < rate / 3:  # grew, then levelled off: a cache filling, not a leak
        return None
    return start, end, rate * 60


def _period(steps: list[int]) -> int | None:
    """The common gap between outlier steps, if most gaps agree."""
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    if len(gaps) < 2:
        return None
    gap, count = Counter(gaps).most_common(1)[0]
    return gap if gap > 1 and count >= 0.6 * len(gaps) else None


def _outlier_advice(period: int | None, batches_per_epoch: int | None, in_data: float) -> str:
    if period and batches_per_epoch and period == batches_per_epoch:
        return ("They come at each epoch's start: keep DataLoader workers alive with "
                "persistent_workers=True, and check what runs between epochs.")
    if in_data >= 50:
        return ("Look at the data: a slow shard, a cache refill, remote reads, or workers that "
                "fall behind (raise prefetch_factor).")
    if period:
        return (f"Look for something that runs every {period} steps: logging with .item() or a "
                "print, a synchronisation, an extra evaluation, garbage collection.")
    return "Look for contention: other processes on the machine, garbage collection, swapping."


def _where(in_data_pct: float) -> str:
    return "mostly waiting for data" if in_data_pct >= 50 else "mostly in compute"


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def _ms(seconds: float) -> float:
    return 1000.0 * seconds


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
