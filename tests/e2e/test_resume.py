"""Exact resume: killed at random moments, any number of times, the final model is the same."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from prudent.store.database import Store
from tests.e2e.conftest import Project, child_of, script

EVERY = 5  # checkpoint interval, steps


def final_state(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def assert_identical(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def attempts(log: Path) -> list[list[int]]:
    """Steps logged by each process, in order."""
    by_pid: dict[str, list[int]] = {}
    for line in log.read_text().splitlines():
        pid, step = line.split()
        by_pid.setdefault(pid, []).append(int(step))
    return list(by_pid.values())


def wait_for_step(log: Path, pid: int, min_steps: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and sum(1 for line in log.read_text().splitlines() if line.startswith(f"{pid} ")) >= min_steps:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} made no progress")


def wait_for_staging(checkpoints: Path, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(checkpoints.glob(".tmp-ckpt-*")):
            return True
        time.sleep(0.0005)
    return False


@pytest.mark.slow
def test_killed_many_times_ends_with_identical_weights(project: Project) -> None:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": f"{EVERY}steps", "PRUDENT_CONSOLE": "off"})
    reference = project.prudent("run", "--run-id", "reference", "--set", "out=reference.pt",
                                "--set", "log=reference.log", "--set", "hidden=384", "--", sys.executable,
                                script("resume_train.py"), timeout=300)
    # the console is off: a rule that stopped the reference says why in the record
    assert reference.returncode == 0, [(e["kind"], e["name"], e["message"])
                                       for e in project.show("reference")["events"]
                                       if e["kind"] in ("rule", "monitor", "lifecycle")]

    log = project.path / "steps.log"
    checkpoints = project.path / ".prudent" / "runs" / "victim" / "checkpoints"
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "victim", "--max-restarts", "10",
         "--restart-backoff-s", "0.1", "--set", "sleep_s=0.03", "--set", "hidden=384", "--",
         sys.executable, script("resume_train.py")],
        cwd=project.path, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rng = random.Random(7)
    plan = ["SIGKILL", "SIGTERM", "SIGKILL-during-write", "SIGTERM", "SIGKILL", "SIGKILL"]
    child, kinds = None, []
    for kind in plan:
        child = child_of(supervisor, child.pid if child else None)
        wait_for_step(log, child.pid, rng.randint(2, 12))
        if kind == "SIGKILL-during-write" and not wait_for_staging(checkpoints):
            kind = "SIGKILL"
        try:
            child.send_signal(signal.SIGTERM if kind == "SIGTERM" else signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
        kinds.append(kind)
        child.wait(timeout=60)
    _, err = supervisor.communicate(timeout=300)
    assert supervisor.returncode == 0, err
    assert len(kinds) >= 5

    assert_identical(final_state(project.path / "reference.pt"), final_state(project.path / "final.pt"))
    runs = attempts(log)
    assert len(runs) == len(kinds) + 1
    for kind, before, after in zip(kinds, runs, runs[1:]):
        repeated = before[-1] - after[0] + 1
        limit = 0 if kind == "SIGTERM" else (2 * EVERY if kind == "SIGKILL-during-write" else EVERY)
        print(f"{kind:22s} at step {before[-1]:3d}: resumed at {after[0]:3d}, "
              f"{repeated} steps done twice (limit {limit})")
        assert 0 <= repeated <= limit, f"{kind}: {repeated} steps done twice (limit {limit})"
    shown = project.show("victim")
    assert shown["restarts"] == len(kinds) and shown["status"] == "completed"


def test_killed_after_a_best_kept_at_an_epochs_end_resumes_exactly(project: Project) -> None:
    # the README's loop, SIGKILLed in epoch 3: the newest checkpoint is early stopping's best,
    # kept inside epoch 2's run.log after the scheduler's step; the relaunch starts epoch 3
    # (the epoch's end is not run again: no second scheduler step, no second evaluation)
    command = ["--", sys.executable, script("readme_loop.py")]
    reference = project.prudent("run", "--run-id", "reference", "--set", "out=reference.pt",
                                *command, timeout=300)
    assert reference.returncode == 0, reference.stderr
    victim = ["run", "--run-id", "victim", "--set", "sleep_s=0.02", *command]
    first = subprocess.Popen([sys.executable, "-m", "prudent", *victim], cwd=project.path,
                             env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    child = child_of(first, None)
    kept = project.path / ".prudent" / "runs" / "victim" / "checkpoints" / "ckpt-0000000088"
    deadline = time.monotonic() + 120
    while not kept.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kept.exists(), first.communicate()[1]
    child.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGKILL
    resumed = project.prudent(*victim, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from ckpt-0000000088: step 88, epoch 3, 0 batches into it" in (
        resumed.stdout + resumed.stderr)
    assert_identical(final_state(project.path / "reference.pt"),
                     final_state(project.path / "final.pt"))
    assert project.show("victim")["status"] == "completed"
    store = Store(f"sqlite:///{project.path / '.prudent' / 'prudent.db'}")
    try:  # each epoch's evaluation logged once, the reference's values
        logged = store.metric_series("victim", "val_acc")
        assert logged == store.metric_series("reference", "val_acc")
    finally:
        store.close()
    assert [step for step, _ in logged] == [44 * epoch for epoch in range(1, 7)]
