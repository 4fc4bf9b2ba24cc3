"""What it costs for the run's record to travel with its checkpoints.

- **bytes per checkpoint**: a run of ``--rows`` metric rows (4 metrics a step) checkpointing
  every ``--every`` steps; each checkpoint commits a gzip'd segment of the rows since the
  previous one (measured: the segments' sizes).
- **import time**: a new machine (a fresh home) starting the same run id reads every segment
  and merges it into its empty store before training (measured: ``RecordSync.import_s``).
- **heartbeat cost per step**: the same loop with heartbeats every 20 ms (a segment and a
  heartbeat each time) and with heartbeats off, interleaved; the training thread does no
  record work, so any difference is the background thread competing for the interpreter.

    python benchmarks/record.py [--rows 100000] [--every 500] [--s3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import prudent
from prudent.checkpoint.manager import Checkpointer
from prudent.cost import CostMeter
from prudent.record import RecordSync
from prudent.store.recorder import MetricsRecorder
from prudent.testing import make_settings, tiny_model

METRICS_PER_STEP = 4


def run_once(home: Path, bucket: Path | str, steps: int, every: int, heartbeat: str,
             work: int = 0) -> tuple[RecordSync, float]:
    """Train ``steps`` steps of run ``bench``; returns its RecordSync and seconds per step."""
    settings = make_settings(home, checkpoint={"url": str(bucket), "every": f"{every}steps",
                                               "heartbeat_interval": heartbeat, "mode": "sync"},
                             cost={"hourly_usd": 3.0, "detect": "off"})
    sync = RecordSync(settings.checkpoint)
    components = [MetricsRecorder(), sync, CostMeter(settings.cost, quiet=True),
                  Checkpointer(settings.checkpoint)]
    run = prudent.init(name="bench", settings=settings, components=components, exit_on_stop=False)
    model = tiny_model()
    run.attach(model=model)
    x = torch.randn(64, 8)
    started = time.perf_counter()
    with run:
        for it in run.steps(steps):
            for _ in range(work):
                model(x).sum().backward()
            run.step(loss=1.0 / (it + 1), lr=3e-4, grad_norm=0.5, tokens=float(it))
    return sync, (time.perf_counter() - started) / max(1, steps)


def bytes_and_import(rows: int, every: int, url: str | None = None) -> dict[str, Any]:
    steps = rows // METRICS_PER_STEP
    with tempfile.TemporaryDirectory() as tmp:
        bucket = url or Path(tmp) / "bucket"
        first, _ = run_once(Path(tmp) / "machine-1", bucket, steps, every, "off")
        os.environ["PRUDENT_HOME"] = str(Path(tmp) / "machine-2")
        second, _ = run_once(Path(tmp) / "machine-2", bucket, steps, every, "off")
        imported = second.imported
    segments = first.segment_bytes
    checkpoints = steps // every
    return {"storage": url or "local folder", "metric_rows": rows, "steps": steps,
            "checkpoint_every_steps": every,
            "checkpoints": checkpoints, "segments": len(segments),
            "record_bytes_per_checkpoint": sum(segments) / max(1, checkpoints),
            "record_bytes_total": sum(segments),
            "bytes_per_metric_row": sum(segments) / rows,
            "import_s": second.import_s,
            "imported_metrics": imported.num_metrics if imported else 0,
            "imported_events": imported.num_events if imported else 0}


def local_s3() -> str:
    """An S3-compatible server (moto's) on loopback, with a bucket: the record over HTTP."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": endpoint})
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}).mkdir("bench")
    return "s3://bench/record"


def heartbeat_cost(steps: int, reps: int) -> dict[str, Any]:
    per_step: dict[str, list[float]] = {"off": [], "20ms": []}
    beats: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for setting in ("off", "0.02s") if rep % 2 == 0 else ("0.02s", "off"):
                home = Path(tmp) / f"{setting}-{rep}"
                os.environ["PRUDENT_HOME"] = str(home)
                sync, seconds = run_once(home, home / "bucket", steps, 10**9, setting, work=1)
                per_step["off" if setting == "off" else "20ms"].append(seconds)
                beats += sync.beat_s
    off, on = statistics.median(per_step["off"]), statistics.median(per_step["20ms"])
    beat_s = statistics.median(beats)
    return {"steps": steps, "reps": reps, "step_us_heartbeat_off": off * 1e6,
            "step_us_heartbeat_20ms": on * 1e6, "difference_us": (on - off) * 1e6,
            "beats": len(beats), "beat_ms_median": beat_s * 1e3,
            # the background work at the default interval, as a share of the loop's time
            "share_at_60s": beat_s / 60.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--steps", type=int, default=3000, help="steps per heartbeat repetition")
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--s3", action="store_true", help="also through a local S3 server (moto)")
    parser.add_argument("--json", default="benchmarks/results/record.json")
    args = parser.parse_args()
    os.environ["PRUDENT_RUN_ID"] = "bench"
    os.environ["PRUDENT_CONSOLE"] = "off"
    torch.set_num_threads(1)
    sizes = bytes_and_import(args.rows, args.every)
    over_s3 = bytes_and_import(args.rows, args.every, local_s3()) if args.s3 else None
    beat = heartbeat_cost(args.steps, args.reps)
    table = Table("figure", "value")
    table.add_row("metric rows in the run", f"{sizes['metric_rows']:,}")
    table.add_row("checkpoints / segments written", f"{sizes['checkpoints']} / {sizes['segments']}"
                  " (checkpoints close together share a segment)")
    table.add_row(f"record bytes per checkpoint ({args.every} steps x {METRICS_PER_STEP} metrics)",
                  f"{sizes['record_bytes_per_checkpoint']:,.0f}")
    table.add_row("record bytes in all", f"{sizes['record_bytes_total']:,}")
    table.add_row("record bytes per metric row", f"{sizes['bytes_per_metric_row']:.1f}")
    table.add_row("import on a new machine", f"{sizes['import_s']:.2f} s "
                  f"({sizes['imported_metrics']:,} metrics, {sizes['imported_events']} events)")
    if over_s3:
        table.add_row("import on a new machine, local S3 server",
                      f"{over_s3['import_s']:.2f} s ({over_s3['segments']} segments)")
    table.add_row("step, heartbeat off", f"{beat['step_us_heartbeat_off']:.1f} µs")
    table.add_row("step, heartbeat every 20 ms", f"{beat['step_us_heartbeat_20ms']:.1f} µs")
    table.add_row("difference (every 20 ms: 3000x the default)", f"{beat['difference_us']:+.1f} µs")
    table.add_row("background work per heartbeat (segment + beat)",
                  f"{beat['beat_ms_median']:.2f} ms (median of {beat['beats']})")
    table.add_row("at the default 60 s, per step on the training thread",
                  f"0 (no handler); background {beat['share_at_60s'] * 100:.4f}% of the time")
    Console().print(table)
    machine = {"python": platform.python_version(), "torch": torch.__version__,
               "cpus": os.cpu_count(), "platform": platform.platform()}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"machine": machine, "record": sizes,
                                           "record_s3": over_s3, "heartbeat": beat}, indent=2))


if __name__ == "__main__":
    main()
