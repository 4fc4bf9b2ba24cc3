"""The end-of-run profile: one JSON-able dict, its one-line form, and its table.

The same dict is the payload of the ``profile``/``summary`` event (so ``prudent show`` and
``prudent profile`` read it from any store) and, with the sampler's timeline added, the
run folder's ``profile.json``.
"""

from __future__ import annotations

import statistics
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from prudent.profile.timer import CATEGORIES, StepTimer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["SCHEMA", "attempts", "build_summary", "print_profile", "summary_line"]

SCHEMA = 1
RECENT_S = 60.0  # the "recent" throughput covers about the last minute of samples
NOT_MEASURED = ("data not measured: the loop fetches its own batches (not through "
                "run.batches), so their loading time is counted in compute")


def build_summary(timer: StepTimer, samples: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Totals, shares, throughput and system use; ``extra`` (device, trace, ...) is merged in."""
    total = timer.total_s
    step_time = timer.step_time()
    return {
        "schema": SCHEMA, "num_steps": timer.num_steps, "first_step": timer.first_step,
        "last_step": timer.first_step + timer.num_steps, "wall_s": round(total, 4),
        "setup_s": round(timer.setup_s, 4), "profiler_s": round(timer.profiler_s, 4),
        "breakdown": {name: {"s": round(seconds, 4), "pct": round(_pct(seconds, total), 2)}
                      for name, seconds in timer.breakdown().items()},
        # a loop that fetches its own batches (nanoGPT's get_batch) has its data time in
        # compute: said, so that "data 0%" is not read as "never waits for data"
        "data_measured": timer.num_batches > 0 or not timer.num_steps,
        "step_time_ms": None if step_time is None else {
            "median": round(1e3 * step_time["median_s"], 4),
            "p90": round(1e3 * step_time["p90_s"], 4)},
        "throughput": _throughput(timer, samples, total),
        "counts": {"evals": timer.num_evals, "checkpoints": timer.num_checkpoints,
                   "outliers": timer.num_outliers},
        "system": _system(samples),
        **extra,
    }


def _throughput(timer: StepTimer, samples: list[dict[str, Any]], total: float) -> dict[str, Any]:
    def rate(count: float) -> float | None:
        return round(count / total, 3) if total > 0 and count else None

    return {
        "steps_per_s": rate(timer.num_steps), "samples_per_s": rate(timer.num_samples),
        "tokens_per_s": rate(timer.num_tokens),
        "batch_size": round(timer.num_samples / timer.num_steps, 2) if timer.num_steps else None,
        "recent": {key: _mean_rate(_recent(samples), key)
                   for key in ("steps_per_s", "samples_per_s", "tokens_per_s")},
    }


def _recent(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Samples of the last minute of training: not setup (before the interval in which the
    first step fell), not the last one (it covers the end of the run)."""
    first = next((i for i, s in enumerate(samples) if s["step"] > 0), len(samples))
    training = samples[first + 1:-1]
    return [s for s in training if s["t"] >= samples[-1]["t"] - RECENT_S]


def _mean_rate(samples: list[dict[str, Any]], key: str) -> float | None:
    mean = statistics.fmean(s[key] for s in samples) if samples else 0.0
    return round(mean, 3) if mean else None


def _system(samples: list[dict[str, Any]]) -> dict[str, Any]:
    if not samples:
        return {"num_samples": 0}
    system: dict[str, Any] = {"num_samples": len(samples)}
    for key in ("cpu_pct", "system_cpu_pct", "rss_mb", "disk_read_mb_s", "disk_write_mb_s",
                "net_recv_mb_s", "net_sent_mb_s", "device_allocated_mb", "device_reserved_mb"):
        values = [s[key] for s in samples if s.get(key) is not None]
        if values:
            system[key] = {"mean": round(statistics.fmean(values), 2),
                           "max": round(max(values), 2), "last": round(values[-1], 2)}
    gpus = _gpus(samples)
    if gpus:
        system["gpus"] = gpus
    return system


def _gpus(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    count = max((len(s.get("gpus", ())) for s in samples), default=0)
    out = []
    for index in range(count):
        readings = [s["gpus"][index] for s in samples if len(s.get("gpus", ())) > index]
        gpu: dict[str, Any] = {"index": index}
        for key in ("util_pct", "mem_used_mb", "power_w"):
            values = [r[key] for r in readings if r.get(key) is not None]
            if values:
                gpu[key] = {"mean": round(statistics.fmean(values), 1),
                            "max": round(max(values), 1)}
        totals = [r["mem_total_mb"] for r in readings if r.get("mem_total_mb")]
        gpu["mem_total_mb"] = round(totals[-1], 1) if totals else None
        out.append(gpu)
    return out


def attempts(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per attempt of a run, oldest first, from each attempt's profile summary: a
    resumed run's newest summary covers its last attempt only, and these say what came
    before (steps, wall time, the time split in %)."""
    return [{"attempt": number, "first_step": s["first_step"], "last_step": s["last_step"],
             "num_steps": s["num_steps"], "wall_s": s["wall_s"],
             **{f"{name}_pct": s["breakdown"][name]["pct"] for name in CATEGORIES}}
            for number, s in enumerate(summaries, start=1)]


def attempt_line(rows: list[dict[str, Any]]) -> str:
    """``the split covers attempt 3 of 3 (steps 251-400); earlier: 1 (steps 0-120, 0:00:31),
    ...`` or "" for a run of one attempt."""
    if len(rows) < 2:
        return ""
    last = rows[-1]

    def span(row: dict[str, Any]) -> str:
        return f"steps {row['first_step']}-{row['last_step']}"

    earlier = ", ".join(f"{r['attempt']} ({span(r)}, {timedelta(seconds=round(r['wall_s']))})"
                        for r in rows[:-1])
    return (f"the split covers attempt {last['attempt']} of {len(rows)} ({span(last)}); "
            f"earlier: {earlier}")


# for people ---------------------------------------------------------------------------------
def summary_line(summary: dict[str, Any]) -> str:
    """``profile: 812 steps in 0:00:41 (19.8 steps/s, 634 samples/s); data 62%, ...``."""
    rates = summary["throughput"]
    speed = ", ".join(f"{rates[k]:.4g} {k.removesuffix('_per_s')}/s"
                      for k in ("steps_per_s", "samples_per_s", "tokens_per_s") if rates.get(k))
    split = ", ".join(f"{name} {summary['breakdown'][name]['pct']:.0f}%" for name in CATEGORIES
                      if summary["breakdown"][name]["pct"] >= 0.5)
    if not summary.get("data_measured", True):
        split += (", " if split else "") + "data not measured"
    found = [f["id"] for f in summary.get("findings", [])]
    verdict = f"findings: {', '.join(found)}" if found else "no bottleneck found"
    wall = timedelta(seconds=round(summary["wall_s"]))
    steps = summary["num_steps"]
    return (f"profile: {steps} step{'' if steps == 1 else 's'} in {wall}"
            + (f" ({speed})" if speed else "") + f"; {split or 'no time measured'}; {verdict}")


def print_profile(console: Console, run_id: str, summary: dict[str, Any],
                  earlier: list[dict[str, Any]] | None = None) -> None:
    """The ``prudent profile`` view: where the time went, throughput, system, findings;
    ``earlier``: the rows of :func:`attempts` when the run had several."""
    from rich.table import Table

    # soft_wrap: long lines (paths, recommendations) stay whole when piped or copied
    console.print(f"[bold]{run_id}[/bold]  {summary_line(summary)}", highlight=False,
                  soft_wrap=True)
    table = Table("where the time went", "seconds", "share", "per step ms")
    steps = max(summary["num_steps"], 1)
    for name in CATEGORIES:
        row = summary["breakdown"][name]
        table.add_row(name, f"{row['s']:.3f}", f"{row['pct']:.1f}%",
                      f"{1e3 * row['s'] / steps:.3f}")
    console.print(table)
    covered = attempt_line(earlier or [])
    if covered:
        console.print(covered, highlight=False, markup=False, soft_wrap=True)
    if not summary.get("data_measured", True):
        console.print(NOT_MEASURED, highlight=False, markup=False, soft_wrap=True)
    for line in _detail_lines(summary):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for finding in summary.get("findings", []):
        console.print(f"[bold]{finding['id']}[/bold]: ", end="")
        console.print(finding["message"], highlight=False, markup=False, soft_wrap=True)


def _detail_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    step_time = summary.get("step_time_ms")
    if step_time:
        lines.append(f"step time: median {step_time['median']:.3f} ms, p90 {step_time['p90']:.3f} "
                     f"ms; setup before the first step {summary['setup_s']:.2f} s; device "
                     f"{summary.get('device', '?')}")
    recent = ", ".join(f"{value:.4g} {key.removesuffix('_per_s')}/s" for key, value
                       in summary["throughput"]["recent"].items() if value)
    if recent:  # samples/s only with run.batches (a loop drawing its own batches has none)
        lines.append(f"recent throughput: {recent}")
    system = summary["system"]
    if "cpu_pct" in system:
        lines.append(f"process CPU {system['cpu_pct']['mean']:.0f}% of a core (mean), system "
                     f"{system['system_cpu_pct']['mean']:.0f}%, memory "
                     f"{system['rss_mb']['last']:.0f} MB (peak {system['rss_mb']['max']:.0f} MB)")
    for gpu in system.get("gpus", []):
        util = gpu.get("util_pct", {}).get("mean")
        mem = gpu.get("mem_used_mb", {}).get("max")
        lines.append(f"GPU {gpu['index']}: utilisation {_or_unknown(util)}% (mean), "
                     f"memory {_or_unknown(mem)} / {_or_unknown(gpu['mem_total_mb'])} MB")
    if summary.get("gpu_note"):
        lines.append(summary["gpu_note"])
    trace = summary.get("trace")
    if trace:
        lines.append(f"trace: {trace.get('trace') or trace.get('message')}")
    if summary.get("profiler_s"):
        lines.append(f"the profiler's own stall (writing the trace): {summary['profiler_s']:.2f} "
                     "s, counted in other and in no step")
    return lines


def _or_unknown(value: Any) -> str:
    return "?" if value is None else f"{value:g}"


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0
