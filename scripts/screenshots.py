"""Screenshots of the report's pages for the docs: docs/run-page.png and docs/study-page.png.

Makes a demo store in a temporary project (a tiny linear model whose batch is poisoned at
step 320, so a rule stops it; a ten-trial study in which rules and the pruner prune),
writes each page's report with ``prudent report``, and photographs it in the system's
Chromium through Playwright (``apt-get install chromium``; Playwright's own browser download
is not needed). Run it from the repository root: ``.venv/bin/python scripts/screenshots.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
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
HEIGHTS = {"run-page.png": 1250, "study-page.png": 1500}  # the top of each page


def prudent(home: Path, *args: str, exit_codes: tuple[int, ...] = (0,)) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
    env |= {"PRUDENT_HOME": str(home / ".prudent"), "PRUDENT_CONSOLE": "plain"}
    done = subprocess.run([sys.executable, "-m", "prudent", *args], cwd=home, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode not in exit_codes:
        sys.exit(f"screenshots: prudent {args[0]} exited {done.returncode}:\n{done.stderr}")


def demo_store(home: Path) -> dict[str, Path]:
    """The two reports, by the screenshot each becomes."""
    prudent(home, "run", "--run-id", "spike-demo", "--name", "linear model, poisoned batch",
            "--set", "steps=400", "--set", "nan_at=320", "--", sys.executable, str(TRAIN),
            exit_codes=(3,))  # 3: a rule stopped it, as the demo means it to
    prudent(home, "report", "spike-demo", "-o", str(home / "run.html"))
    (home / "space.yaml").write_text(SPACE)
    enqueued = [arg for trial in TRIALS for arg in ("--enqueue", trial)]
    prudent(home, "tune", "--space", "space.yaml", "--objective", "val_acc", "--study", "demo",
            "--trials", "10", "--workers", "2", "--pruner", "median", "--max-epochs", "4",
            "--seed", "7", *enqueued, "--", sys.executable, str(TUNE))
    prudent(home, "report", "--study", "demo", "-o", str(home / "study.html"))
    return {"run-page.png": home / "run.html", "study-page.png": home / "study.html"}


def shoot(pages: dict[str, Path], out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("screenshots: no chromium on PATH (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        for name, report in pages.items():
            page.goto(report.as_uri())
            page.wait_for_selector("#app[data-ready]", timeout=30_000)
            page.wait_for_selector(".curve[data-drawn], #history[data-drawn]", timeout=30_000)
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
        shoot(demo_store(Path(folder)), args.out)


if __name__ == "__main__":
    main()
