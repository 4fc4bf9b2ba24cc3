"""Screenshots of the pages for the docs: docs/run-page.png, runs-page.png, compare-page.png
and study-page.png.

Makes a demo store in a temporary project (a tiny linear model whose batch is poisoned at
step 320, so a rule stops it, and the same model trained clean at a lower learning rate; a
ten-trial study in which rules and the pruner prune), writes the run's and the study's report with ``prudent report``,
starts ``prudent ui`` on a free loopback port for the runs list and the compare page, and
photographs each in the system's Chromium through Playwright (``apt-get install chromium``;
Playwright's own browser download is not needed). Run it from the repository root:
``.venv/bin/python scripts/screenshots.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "tests" / "ui" / "scripts" / "train.py"
TUNE = ROOT / "tests" / "e2e" / "scripts" / "tune_train.py"
SPACE = """
lr:        {type: float, low: 1.0e-4, high: 1.0e3, log: true}
hidden:    {type: int, low: 4, high: 64, log: true}
optimizer: {type: categorical, choices: [adam, sgd]}
momentum:  {type: float, low: 0.5, high: 0.99, when: {optimizer: sgd}}
"""
TRIALS = ['{"lr": 1000, "optimizer": "sgd", "momentum": 0.9}',  # NaN: a rule prunes it
          '{"lr": 0.05, "hidden": 32, "optimizer": "adam"}',
          '{"lr": 0.0001, "hidden": 4, "optimizer": "sgd", "momentum": 0.5}']  # the pruner's
WIDTH = 1280
HEIGHTS = {"run-page.png": 1250, "runs-page.png": 520, "compare-page.png": 1100,
           "study-page.png": 1500}  # the top of each page


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
    return env | {"PRUDENT_HOME": str(home / ".prudent"), "PRUDENT_CONSOLE": "plain"}


def prudent(home: Path, *args: str, exit_codes: tuple[int, ...] = (0,)) -> None:
    done = subprocess.run([sys.executable, "-m", "prudent", *args], cwd=home, env=_env(home),
                          capture_output=True, text=True, timeout=600)
    if done.returncode not in exit_codes:
        sys.exit(f"screenshots: prudent {args[0]} exited {done.returncode}:\n{done.stderr}")


def demo_store(home: Path) -> dict[str, Path]:
    """The two reports, by the screenshot each becomes."""
    prudent(home, "run", "--run-id", "spike-demo", "--name", "linear model, poisoned batch",
            "--set", "steps=400", "--set", "nan_at=320", "--", sys.executable, str(TRAIN),
            exit_codes=(3,))  # 3: a rule stopped it, as the demo means it to
    prudent(home, "run", "--run-id", "clean-demo", "--name", "clean data, lr 0.02",
            "--set", "steps=400", "--set", "lr=0.02", "--", sys.executable, str(TRAIN))
    prudent(home, "report", "spike-demo", "-o", str(home / "run.html"))
    (home / "space.yaml").write_text(SPACE)
    enqueued = [arg for trial in TRIALS for arg in ("--enqueue", trial)]
    prudent(home, "tune", "--space", "space.yaml", "--objective", "val_acc", "--study", "demo",
            "--trials", "10", "--workers", "2", "--pruner", "median", "--max-epochs", "4",
            "--seed", "7", *enqueued, "--", sys.executable, str(TUNE))
    prudent(home, "report", "--study", "demo", "-o", str(home / "study.html"))
    return {"run-page.png": home / "run.html", "study-page.png": home / "study.html"}


@contextmanager
def dashboard(home: Path) -> Iterator[str]:
    """``prudent ui`` over the demo store on a free loopback port: its address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "prudent", "ui", "--port", str(port)],
                              cwd=home, env=_env(home), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/api/runs", timeout=5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"screenshots: prudent ui did not answer: {server.stderr.read()}")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.communicate(timeout=30)


def shoot(pages: dict[str, Path | str], out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("screenshots: no chromium on PATH (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        for name, report in pages.items():
            page.goto(report if isinstance(report, str) else report.as_uri())
            page.wait_for_selector("#app[data-ready]", timeout=30_000)
            if name == "runs-page.png":
                page.wait_for_selector("#runs tbody tr", timeout=30_000)
            else:
                page.wait_for_selector(".curve[data-drawn], #history[data-drawn]",
                                       timeout=30_000)
            page.wait_for_timeout(1500)  # the charts drawn after the first frame
            page.screenshot(path=str(out / name), full_page=True,
                            clip={"x": 0, "y": 0, "width": WIDTH, "height": HEIGHTS[name]})
            print(f"screenshots: {out / name}")
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prudent-screenshots-") as folder:
        home = Path(folder)
        pages: dict[str, Path | str] = dict(demo_store(home))
        with dashboard(home) as url:
            pages |= {"runs-page.png": url + "/",
                      "compare-page.png": url + "/compare?ids=spike-demo,clean-demo"}
            shoot(pages, args.out)


if __name__ == "__main__":
    main()
