"""Page data made by hand, for the browser tests of how a page reads: a run with a loss falling
over decades, a near-constant series, a metric logged once, a short profile, no price, long
event messages; runs of one name compared. The same dicts as :mod:`prudent.report.pages`."""

from __future__ import annotations

from typing import Any

START = 1_780_000_000.0
LONG = ("the data loader was slow for 40 steps in a row (median 3.2 s against 0.4 s before); "
        "prudent requested a stop so the run could be resumed on a healthier host ") * 2


def run(run_id: str = "tiny-20261205-203324-ab12", scale: float = 1.0) -> dict[str, Any]:
    return {"id": run_id, "name": "tiny", "status": "completed", "stop_reason": None,
            "config": {"lr": 0.1 * scale}, "restarts": 0, "cost_usd": 0.0, "step": 299,
            "epoch": 0, "host": "vm", "command": "python train.py", "exit_code": 0,
            "started_at": START, "ended_at": START + 300, "metrics": {}, "duration_s": 300.0}


def series(name: str, steps: list[int], values: list[float]) -> dict[str, Any]:
    return {"name": name, "steps": steps, "values": values, "count": len(steps),
            "downsampled": False}


def curves(scale: float = 1.0) -> list[dict[str, Any]]:
    steps = list(range(300))
    noise = [0.15 * ((s * 7919) % 13 - 6) / 6 for s in steps]  # a jagged loss, to smooth
    return [series("loss", steps, [scale * 2 * 0.975 ** s * (1 + n) + 0.002
                                   for s, n in zip(steps, noise, strict=True)]),
            series("mem_mb", steps, [450.27 + 0.53 * s / 299 for s in steps]),
            series("final_acc", [299], [0.93])]


def timeline(num_samples: int) -> list[dict[str, Any]]:
    return [{"t": 2.0 + 3 * i, "step": 20 + 20 * i, "steps_per_s": 12.5 + (i % 3) * 0.4,
             "cpu_pct": 95.0 - i, "rss_mb": 450.27 + 0.53 * i / max(num_samples - 1, 1),
             "data_pct": 20.0, "compute_pct": 75.0, "other_pct": 5.0}
            for i in range(num_samples)]


def run_page(num_samples: int = 12) -> dict[str, Any]:
    """A finished run as ``pages.run_page`` gives it, with ``num_samples`` profiler samples."""
    rows = [{"step": 0, "kind": "lifecycle", "name": "start", "message": "run started",
             "wall": START},
            {"step": 100, "kind": "checkpoint", "name": "saved", "message": "checkpoint at "
             "step 100 in .prudent/runs/tiny/checkpoints/step-100", "wall": START + 100},
            {"step": 250, "kind": "lifecycle", "name": "stop_requested", "message": LONG,
             "wall": START + 250}]
    markers = [{"step": 100, "kind": "checkpoint", "name": "saved", "message": "checkpoint",
                "wall": START + 100}]
    profile = {"breakdown": {"data": {"pct": 20.0, "s": 6.0}, "compute": {"pct": 75.0, "s": 22.5},
                             "other": {"pct": 5.0, "s": 1.5}},
               "throughput": {"steps_per_s": 12.5}, "step_time_ms": {"median": 80, "p90": 95},
               "num_steps": 300, "wall_s": 30.0, "device": "cpu"}
    return {"page": "run", "run": run(), "verdict": "run tiny completed, 300 steps; cost $0.00",
            "token": "t", "series": curves(), "markers": markers,
            "events": {"total": len(rows), "rows": rows}, "profile": profile,
            "timeline": timeline(num_samples), "findings": [],
            "cost": {"total_usd": 0.0, "by_attempt": []},
            "cost_over_time": [{"wall": START, "usd": 0.0, "step": 0},
                               {"wall": START + 300, "usd": 0.0, "step": 299}]}


def compare_page() -> dict[str, Any]:
    """Three runs all named "tiny", as ``pages.compare_page`` gives them."""
    ids = ["tiny-20261205-203324-ab12", "tiny-20261205-203325-cd34", "tiny-20261205-203326-ef56"]
    runs = [{"run": run(i, 1 + k), "series": curves(1 + k)} for k, i in enumerate(ids)]
    return {"page": "compare", "runs": runs,
            "config": [{"key": "lr", "values": [r["run"]["config"]["lr"] for r in runs],
                        "differs": True}]}
