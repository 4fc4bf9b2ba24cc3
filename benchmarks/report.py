"""A run with a million metric points: how fast its page opens, how big its report is.

The store holds one run of ``--points`` loss values (one per step), an eval metric and the
learning rate every 1,000 steps, a checkpoint every 10,000 steps and a rule firing: the shape
of a long real run. Measured, interleaved over ``--repeat`` rounds:

- **dashboard page, cold**: a fresh ``prudent ui`` (nothing cached), Debian's Chromium opens
  ``/runs/big``; from navigation start to the page shown (verdict, markers' events, tables:
  the quick answer) and to every curve drawn (the page's own ``performance.now()`` when Plotly
  resolved its last chart; the loss curve drawn must hold the spike). Target: under 1 s.
- **dashboard page load, warm**: the same page again (the server's cache by the run's token).
- **report**: ``prudent report`` builds the file (seconds), its size and its data part (the
  JSON in the page); then Chromium opens the file, to the page shown and to every curve drawn
  (as above). Targets: data < 1 MB, file < 6 MB, drawn under 1 s.
- **without downsampling**: the data part the report would carry with every point (what a
  viewer that ships raw series sends), for the ratio.
- **what the rollup costs its writer**: CPU per metric row (thread clock) for the store's
  write with its rollup against the bare insert of the same rows, in batches of 600.

    python benchmarks/report.py [--points 1000000] [--repeat 3] [--json PATH] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from prudent.report.pages import run_page
from prudent.report.reader import ReadOnlyStore
from prudent.report.render import bundle_for, page_html, to_json
from prudent.store.database import Store, metrics

ROOT = Path(__file__).resolve().parents[1]
SPIKE = 40.0
TARGETS = {"page_open_cold_s": 1.0, "page_load_cold_s": 1.0, "report_drawn_s": 1.0,
           "report_data_bytes": 1e6, "report_bytes": 6e6}


PROFILE_SERIES = ("cpu_pct", "system_cpu_pct", "rss_mb", "steps_per_s", "samples_per_s",
                  "data_pct", "compute_pct", "other_pct")


def build_store(home: Path, points: int, profile_every: int = 0) -> None:
    """One run of ``points`` steps, written through the store as a run writes it; with
    ``profile_every``, the profiler's samples (``profile/*``) every that many steps and no
    ``profile.json`` beside it (a live run's page, or a run from another machine)."""
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    started = time.time() - points * 0.05
    store.create_run("big", "a long run", config={"lr": 3e-4, "steps": points},
                     command="python train.py", started_at=started)
    rng = random.Random(0)
    rows: list[dict[str, Any]] = []
    for step in range(1, points + 1):
        loss = 2.5 * math.exp(-step / (points / 5)) + 0.3 + 0.05 * rng.random()
        if step == int(points * 0.6):
            loss = SPIKE  # the spike the rule fired on: it must survive downsampling
        rows.append({"run_id": "big", "step": step, "name": "loss", "value": loss,
                     "wall": step * 0.05})
        if step % 1000 == 0:
            rows.append({"run_id": "big", "step": step, "name": "val_loss", "value": loss * 1.1,
                         "wall": step * 0.05})
            rows.append({"run_id": "big", "step": step, "name": "lr",
                         "value": 3e-4 * math.cos(math.pi * step / points / 2), "wall": 0.0})
        if profile_every and step % profile_every == 0:
            rows.extend({"run_id": "big", "step": step, "name": f"profile/{name}",
                         "value": 50 + 10 * rng.random(), "wall": started + step * 0.05}
                        for name in PROFILE_SERIES)
        if len(rows) >= 50_000:
            store.add_metrics(rows)
            rows = []
    store.add_metrics(rows)
    events = [{"run_id": "big", "step": s, "kind": "checkpoint", "name": "saved",
               "message": f"ckpt-{s:010d}: 48.0 MB", "payload": "{}", "wall": s * 0.05}
              for s in range(10_000, points + 1, 10_000)]
    events.append({"run_id": "big", "step": int(points * 0.6) + 1, "kind": "rule",
                   "name": "loss_spike", "message": "loss 40.0 is 13x its recent mean",
                   "payload": "{}", "wall": points * 0.03})
    store.add_events(events)
    store.update_run("big", status="completed", step=points, ended_at=time.time())
    store.close()


def write_cost(folder: Path, num_rows: int = 200_000, batch: int = 600) -> dict[str, float]:
    """CPU (the writing thread's clock) per metric row, batches as the writer thread commits
    them (``batch`` rows, ~0.5 s of a fast run): the store's write with its rollup, and the
    bare insert of the same rows (what it was before the rollup)."""
    rows = [{"run_id": "w", "step": i // 2, "name": ("loss", "lr")[i % 2], "wall": i * 0.01,
             "value": random.random()} for i in range(num_rows)]
    figures = {}
    for variant in ("plain", "rollup"):
        path = folder / f"write-{variant}.db"
        store = Store(f"sqlite:///{path}")  # WAL, the store's own pragmas
        engine = sa.create_engine(f"sqlite:///{path}")
        started = time.thread_time()
        for start in range(0, num_rows, batch):
            part = rows[start:start + batch]
            if variant == "rollup":
                store.add_records(part, [])
            else:
                with engine.begin() as conn:
                    conn.execute(metrics.insert(), part)
        figures[f"write_cpu_us_per_row_{variant}"] = (time.thread_time() - started) / num_rows * 1e6
        engine.dispose()
        store.close()
        path.unlink()
    return figures


def report_figures(home: Path) -> dict[str, Any]:
    store = ReadOnlyStore(f"sqlite:///{home / 'prudent.db'}")
    try:
        started = time.perf_counter()
        data = run_page(store, "big", home)
        html = page_html(data, "a long run", inline=True)
        build_s = time.perf_counter() - started
        raw = [store.metric_series("big", s["name"]) for s in data["series"]]
    finally:
        store.close()
    (home / "report.html").write_text(html)
    raw_bytes = len(to_json([{"steps": [p[0] for p in r], "values": [p[1] for p in r]}
                             for r in raw]))
    return {"report_build_s": build_s, "report_bytes": len(html.encode()),
            "report_data_bytes": len(to_json(data).encode()),
            "raw_data_bytes": raw_bytes, "points_drawn": sum(len(s["steps"])
                                                              for s in data["series"])}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_ui(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PRUDENT_HOME": str(home)}
    server = subprocess.Popen([sys.executable, "-m", "prudent", "ui", "--port", str(port)],
                              cwd=home, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/assets/app.css", timeout=5).close()
            return server, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("prudent ui did not start")


def drawn_s(page: Any, url: str) -> tuple[float, float]:
    """Navigation start to the page shown (verdict, events, tables), and to every curve drawn,
    by the page's own clock."""
    page.goto(url)
    page.wait_for_selector("#app[data-curves-drawn-ms]", timeout=60_000)
    curves = page.locator(".curve").count()
    assert curves >= 2, "the run's curves were not drawn"
    drawn = page.evaluate("""() => Math.max(...document.querySelector('.curve[data-metric="loss"]')
        .data[0].y.filter((v) => v !== null))""")
    assert drawn == SPIKE, f"the loss spike ({SPIKE}) is not on the drawn curve (max {drawn})"
    return (float(page.get_attribute("#app", "data-open-ms")) / 1000,
            float(page.get_attribute("#app", "data-curves-drawn-ms")) / 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "report.json"))
    parser.add_argument("--keep", default=None, help="Build the store here and keep it.")
    parser.add_argument("--profile-every", type=int, default=0, help="Add the profiler's "
                        "samples every N steps (0: none, the lead's definition; 40: a real "
                        "run's profile/* series, their charts drawn too).")
    args = parser.parse_args()
    args.load = os.getloadavg()  # others' work on the machine skews every figure: say how much
    from playwright.sync_api import sync_playwright

    home = Path(args.keep or tempfile.mkdtemp(prefix="prudent-report-bench-"))
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "prudent.db").exists():
        started = time.perf_counter()
        build_store(home, args.points, args.profile_every)
        print(f"store of {args.points:,} points built in {time.perf_counter() - started:.1f} s")
    rounds: list[dict[str, Any]] = []
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(args.repeat):  # interleaved: each round measures every variant
            server, url = start_ui(home)
            try:
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                cold_open, cold = drawn_s(page, url + "/runs/big")
                _, warm = drawn_s(page, url + "/runs/big")
                page.close()
            finally:
                server.terminate()
                server.wait(30)
            figures = report_figures(home) | write_cost(home)
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            figures["report_open_s"], figures["report_drawn_s"] = drawn_s(
                page, (home / "report.html").as_uri())
            page.close()
            rounds.append({"page_open_cold_s": cold_open, "page_load_cold_s": cold,
                           "page_load_warm_s": warm, **figures})
        browser.close()
    args.home = home
    write(rounds, args)
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)


def write(rounds: list[dict[str, Any]], args: argparse.Namespace) -> None:
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    table = Table("measure (median of rounds)", "value", "target", "ratio", "each round",
                  title=f"a run of {args.points:,} metric points")
    units = {"_s": ("s", 1), "_bytes": ("MB", 1e6)}
    for key, value in median.items():
        unit, scale = next(((u, s) for suffix, (u, s) in units.items() if key.endswith(suffix)),
                           ("", 1))
        target = TARGETS.get(key)
        table.add_row(key, f"{value / scale:.3f} {unit}",
                      f"< {target / scale:g} {unit}" if target else "",
                      f"{value / target:.2f} of target" if target else "",
                      " ".join(f"{r[key] / scale:.3f}" for r in rounds))
    shrink = median["raw_data_bytes"] / median["report_data_bytes"]
    table.add_row("data without / with downsampling", f"{shrink:.0f}x", "", "", "")
    Console(width=150).print(table)
    store = ReadOnlyStore(f"sqlite:///{args.home / 'prudent.db'}")
    try:
        rollup = store.rollup_covers("big")
    finally:
        store.close()
    result = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "platform": platform.platform(), "load_average_start": args.load,
                          "load_average": os.getloadavg()},
              "points": args.points, "profile_every": args.profile_every,
              "chart_bundle": bundle_for("run"), "rollup": rollup,
              "targets": TARGETS, "median": median, "rounds": rounds}
    print(f"chart bundle {result['chart_bundle']}; curves from the rollup: {rollup}; load "
          f"average {args.load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
