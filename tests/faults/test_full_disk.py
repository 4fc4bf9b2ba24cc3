"""The store never decides how a run ends: its disk fills up mid-run, the machine is
preempted, and the run still exits 75, leaves no cut-short file, and loses no row (what the
store did not take is kept in the run's record beside the checkpoints and imported at the next
start). A real tmpfs, a real SIGTERM, real processes."""

from __future__ import annotations

import collections
import errno
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prudent.store.database import Store
from tests.e2e.conftest import Project, script
from tests.faults.conftest import mounted_tmpfs

STEPS = 300


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    try:
        with open(filler, "wb") as out:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
    except OSError as exc:  # full (the store's own files may have filled it first)
        assert exc.errno == errno.ENOSPC
    return filler


def wait_for(process: subprocess.Popen[str], line: str) -> None:
    for seen in process.stdout:  # type: ignore[union-attr]
        if seen.strip() == line:
            return
    raise AssertionError(f"the run ended before printing {line!r}")


@pytest.mark.slow
def test_a_full_disk_under_the_store_changes_nothing_of_how_the_run_ends(
        project: Project, tmp_path: Path) -> None:
    small_disk = mounted_tmpfs(tmp_path / "disk", "16m")  # room for the store's WAL (4 MB)
    project.env.update({"PRUDENT_HOME": str(small_disk / "home"), "PRUDENT_CONSOLE": "off",
                        "PRUDENT_CHECKPOINT_URL": str(project.path / "checkpoints")})
    command = [sys.executable, "-m", "prudent", "run", "--run-id", "full", "--", sys.executable,
               script("store_outage_train.py"), str(STEPS)]
    first = subprocess.Popen(command, cwd=project.path, env=project.env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(first, "STEP 50")
        filler = fill(small_disk)
        wait_for(first, "STEP 150")
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    finally:  # whatever failed, no process of this test outlives it
        if first.poll() is None:
            first.kill()
            first.communicate(timeout=60)
    assert first.returncode == 75, err  # preempted, as if the store were fine
    assert "Traceback" not in err, err
    assert "kept in the run's record beside its checkpoints" in err
    left = [p for root in (small_disk / "home", project.path / "checkpoints")
            for p in root.rglob("*") if p.is_file() and (p.stat().st_size == 0 or ".tmp" in p.name)]
    assert left == []  # no cut-short profile.json, no temporary file

    filler.unlink(missing_ok=True)
    second = project.prudent("run", "--run-id", "full", "--", sys.executable,
                             script("store_outage_train.py"), str(STEPS), timeout=300)
    assert second.returncode == 0, second.stderr
    store = Store(f"sqlite:///{small_disk / 'home' / 'prudent.db'}")
    try:
        run = store.get_run("full")
        assert run is not None and run["status"] == "completed"
        steps = [step for step, _ in store.metric_series("full", "loss")]
        names = [e["name"] for e in store.events("full")]
    finally:
        store.close()
    counts = collections.Counter(steps)
    assert sorted(counts) == list(range(1, run["step"] + 1))  # every step's loss, none lost
    assert max(counts.values()) == 1  # and none twice
    assert names.count("stop_requested") == 1 and "record_imported" in names
