"""Another process holds the SQLite store's write lock (a ``sqlite3`` shell in a transaction,
a backup) when a run starts: the run says so in one line after 5 s and trains; the lock
never decides how it ends. A real store, a real lock held by a real process, `prudent run`."""

from __future__ import annotations

import collections
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import assert_identical, final_state

NUM_STEPS = 72
LOCKED_LINE = "has been locked by another process for 5 s"
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
sys.stdin.read()  # held until the test closes our stdin
"""


def _hold_lock(db: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.stdout.close()
    return holder


def _release(holder: subprocess.Popen[str]) -> None:
    if holder.poll() is None:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def _reference(project: Project) -> dict:
    done = project.prudent("run", "--run-id", "reference", "--set", "sleep_s=0", "--",
                           sys.executable, script("store_commit_train.py"), timeout=180)
    assert done.returncode == 0, done.stderr
    (project.path / "steps.log").unlink()
    return final_state(project.path / "final.pt")


def _loss_steps(db: Path, run_id: str) -> collections.Counter[int]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return collections.Counter(s for (s,) in conn.execute(
            "SELECT step FROM metrics WHERE run_id = ? AND name = 'loss'", (run_id,)))


def _start(project: Project, run_id: str, sleep_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", run_id, "--set",
         f"sleep_s={sleep_s}", "--", sys.executable, script("store_commit_train.py")],
        cwd=project.path, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _steps_logged(project: Project) -> int:
    log = project.path / "steps.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.slow
def test_a_run_trains_while_the_store_is_locked_and_is_recorded_once_it_frees(
        project: Project) -> None:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "10steps", "PRUDENT_CONSOLE": "off"})
    reference = _reference(project)
    db = project.path / ".prudent" / "prudent.db"
    holder = _hold_lock(db)
    try:
        run = _start(project, "locked", sleep_s=0.1)  # ~7 s of training
        deadline = time.monotonic() + 90
        while _steps_logged(project) < 20 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
        trained_while_locked = _steps_logged(project)
    finally:
        _release(holder)
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    assert trained_while_locked >= 20, err  # training did not wait for the lock
    assert err.count(LOCKED_LINE) == 1, err  # one line, not one per store call
    assert "is free again" in err and "waiting for the run store" not in err, err
    assert_identical(reference, final_state(project.path / "final.pt"))
    shown = project.show("locked")
    assert shown["status"] == "completed" and shown["step"] == NUM_STEPS
    assert _loss_steps(db, "locked") == collections.Counter(range(1, NUM_STEPS + 1))


@pytest.mark.slow
def test_a_store_locked_for_the_whole_run_keeps_its_rows_in_the_record(project: Project) -> None:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "10steps", "PRUDENT_CONSOLE": "off"})
    reference = _reference(project)
    db = project.path / ".prudent" / "prudent.db"
    holder = _hold_lock(db)
    try:
        done = project.prudent("run", "--run-id", "locked", "--set", "sleep_s=0", "--",
                               sys.executable, script("store_commit_train.py"), timeout=180)
        still_held = holder.poll() is None
    finally:
        _release(holder)
    assert done.returncode == 0, done.stderr
    assert still_held and done.stderr.count(LOCKED_LINE) == 1, done.stderr
    assert "stayed locked until the run ended" in done.stderr, done.stderr
    assert_identical(reference, final_state(project.path / "final.pt"))
    assert not list((project.path / ".prudent").rglob(".tmp-*"))  # nothing half-written left
    (project.path / "steps.log").unlink()
    again = project.prudent("run", "--run-id", "locked", "--", sys.executable,
                            script("store_commit_train.py"), timeout=180)
    assert again.returncode == 0 and "already completed at step 72" in again.stderr, again.stderr
    assert not (project.path / "steps.log").exists()  # its record says completed: not trained
    repaired = project.prudent("store", "repair")  # the run from its record beside the checkpoints
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert _loss_steps(db, "locked") == collections.Counter(range(1, NUM_STEPS + 1))
    assert project.show("locked")["status"] == "completed"
