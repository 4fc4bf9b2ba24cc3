"""The shared PostgreSQL store goes away for good as a run ends: the run that trained still
exits 0, what the store did not take waits in the run's record beside its checkpoints, and
the next start (on another machine, once a server answers again) imports it. A real server
stopped for real (tests/postgres.py), real processes."""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prudent.store.database import Store
from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import assert_identical, final_state
from tests.postgres import PostgresServer

pytestmark = pytest.mark.timeout(240)

NUM_STEPS = 72  # resume_train.py: 3 epochs of 24 batches
WAIT_S = 5  # store.unreachable_wait_s: each process waits this long for the server, once


def _machine(root: Path, name: str, store_url: str, bucket: Path) -> Project:
    machine = Project(root / name)
    machine.path.mkdir()
    (machine.path / "prudent.yaml").write_text(f"store: {{unreachable_wait_s: {WAIT_S}}}\n")
    machine.env.update(PRUDENT_HOME=str(machine.path / ".prudent"), PRUDENT_STORE_URL=store_url,
                       PRUDENT_CHECKPOINT_URL=str(bucket), PRUDENT_CHECKPOINT_EVERY="5steps",
                       PRUDENT_CONSOLE="off")
    return machine


def _steps_logged(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.slow
def test_a_store_gone_for_good_at_the_end_loses_no_row_and_the_next_start_brings_them(
        tmp_path: Path, postgres: PostgresServer, pg_url: str) -> None:
    reference = Project(tmp_path)
    reference.env["PRUDENT_CONSOLE"] = "off"
    done = reference.prudent("run", "--run-id", "ref", "--set", "workers=0", "--set",
                             "out=reference.pt", "--set", "log=reference.log", "--",
                             sys.executable, script("resume_train.py"), timeout=180)
    assert done.returncode == 0, done.stderr

    bucket = tmp_path / "bucket"
    first = _machine(tmp_path, "machine-1", pg_url, bucket)
    command = ["run", "--run-id", "gone", "--set", "workers=0", "--set", "sleep_s=0.05", "--",
               sys.executable, script("resume_train.py")]
    process = subprocess.Popen([sys.executable, "-m", "prudent", *command], cwd=first.path,
                               env=first.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + 120
        while _steps_logged(first.path / "steps.log") < NUM_STEPS - 8:
            assert time.monotonic() < deadline and process.poll() is None, "no progress"
            time.sleep(0.01)
        postgres.stop()  # for good: it answers no more while this machine is up
        started = time.monotonic()
        out, err = process.communicate(timeout=180)
        ended_s = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=60)
        postgres.start()
    assert process.returncode == 0, err  # it trained: the store's absence changes nothing
    # one wait for the server in the training process and one in the supervisor's, not one
    # for every call each makes (minutes)
    assert ended_s < 4 * WAIT_S + 10, err
    assert "Traceback" not in err, err
    assert "kept in the run's record beside its checkpoints" in err, err
    assert (first.path / "final.pt").exists()
    assert_identical(final_state(tmp_path / "reference.pt"), final_state(first.path / "final.pt"))

    # another machine starts the same run once a server answers: the record comes in
    second = _machine(tmp_path, "machine-2", pg_url, bucket)
    again = second.prudent(*command, timeout=180)
    assert again.returncode == 0, again.stderr
    assert_identical(final_state(tmp_path / "reference.pt"), final_state(second.path / "final.pt"))
    store = Store(pg_url)
    try:
        run = store.get_run("gone")
        steps = [step for step, _ in store.metric_series("gone", "loss")]
        names = [e["name"] for e in store.events("gone")]
    finally:
        store.close()
    assert run is not None and run["status"] == "completed"
    counts = collections.Counter(steps)
    assert sorted(counts) == list(range(1, NUM_STEPS + 1))  # every step's loss
    assert max(counts.values()) == 1  # and none twice
    assert "record_imported" in names
    print(f"store stopped at step ~{NUM_STEPS - 8}; the run ended {ended_s:.1f} s later; "
          f"{len(steps)} loss rows after the next start; events: {collections.Counter(names)}")
