"""``prudent run``'s exit code when a launcher (torchrun) flattens every worker's code to 1."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from prudent.launch.supervisor import Supervisor, _job_code
from prudent.store.database import Store
from prudent.wiring.config import ProjectSettings

# a training script that stops with a reason, crashes, or completes and then crashes...
TRAIN = """
import sys
import prudent
from prudent.kernel.errors import StopRun
run = prudent.init(name="flat", components=[])
how = sys.argv[1]
with run:
    run.step(loss=1.0)
    if how == "crash":
        raise RuntimeError("the training step failed")
    if how != "crash_after":
        raise StopRun(how, "told to stop")
raise RuntimeError("teardown failed after training")
"""
# ...under a launcher that, like torchrun, exits 1 for any non-zero code of its worker
FLATTEN = ("import subprocess, sys; "
           "sys.exit(1 if subprocess.call([sys.executable, '-c', sys.argv[1], sys.argv[2]]) else 0)")


def _record(status: str, exit_code: int | None) -> dict[str, Any]:
    return {"status": status, "exit_code": exit_code}


@pytest.mark.parametrize(("code", "record", "expected"), [
    (1, _record("stopped", 75), 75),  # torchrun after a SIGTERM: preempted
    (1, _record("stopped", 3), 3),  # a rule's stop on any rank
    (1, _record("stopped", 130), 130),
    (1, _record("failed", 1), 1),  # a real crash stays a crash
    (1, _record("completed", 0), 1),  # trained to the end, then crashed: still 1
    (1, _record("stopped", None), 1),
    (1, None, 1),
    (75, _record("stopped", 75), 75),  # a plain python child: its own code already
    (-9, _record("stopped", 75), -9),  # a signal is not a flattened code
])
def test_the_job_code_is_the_records_only_when_a_stop_was_flattened_to_1(
        code: int, record: dict[str, Any] | None, expected: int) -> None:
    assert _job_code(code, record) == expected


@pytest.mark.parametrize(("how", "expected", "status"), [
    ("preempted", 75, "stopped"), ("rule:non_finite", 3, "stopped"), ("budget", 4, "stopped"),
    ("crash", 1, "failed"), ("crash_after", 1, "completed"),
])
def test_prudent_run_exits_with_the_records_code_through_a_launcher_that_flattens_it(
        settings: ProjectSettings, how: str, expected: int, status: str) -> None:
    command = [sys.executable, "-c", FLATTEN, TRAIN, how]
    assert Supervisor(command, settings, run_id="flat").run() == expected
    store = Store.open(settings.store)
    try:
        record = store.get_run("flat")
        assert record is not None and record["status"] == status
    finally:
        store.close()


def test_a_flattened_preemption_is_relaunched_and_the_stop_of_the_last_attempt_wins(
        settings: ProjectSettings) -> None:
    command = [sys.executable, "-c", FLATTEN, TRAIN, "preempted"]
    supervisor = Supervisor(command, settings, run_id="again", max_restarts=1,
                            restart_backoff_s=0.01)
    assert supervisor.run() == 75  # relaunched once, preempted again: out of restarts
    store = Store.open(settings.store)
    try:
        assert store.get_run("again")["restarts"] == 1
    finally:
        store.close()


# ...under a launcher that, like torchrun, copies the failed worker's error file, with its exit
# code, into its own (TORCHELASTIC_ERROR_FILE), then exits 1; its worker writes no record
COPY_ERROR_FILE = """
import json, os, subprocess, sys, tempfile
own = os.environ["TORCHELASTIC_ERROR_FILE"]
worker_file = os.path.join(tempfile.mkdtemp(), "error.json")
env = {**os.environ, "TORCHELASTIC_ERROR_FILE": worker_file, "PRUDENT_RUN_ID": "elsewhere"}
code = subprocess.call([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env)
if code:
    error = json.load(open(worker_file))
    error["message"]["errorCode"] = code
    json.dump(error, open(own, "w"))
sys.exit(1 if code else 0)
"""


@pytest.mark.parametrize(("how", "expected"), [("preempted", 75), ("rule:non_finite", 3)])
def test_a_node_without_the_record_exits_with_its_workers_code(
        settings: ProjectSettings, how: str, expected: int) -> None:
    command = [sys.executable, "-c", COPY_ERROR_FILE, TRAIN, how]
    assert Supervisor(command, settings, run_id="node-b").run() == expected


@pytest.mark.parametrize(("environ", "wait_s"), [
    ({}, 0.0),  # one process
    ({"RANK": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}, 5.0),  # rank 0 writes first
    ({"RANK": "0", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2"}, 2.0),  # hosts the rendezvous
    ({"RANK": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}, 0.0),  # another node: at once
])
def test_refusing_ranks_leave_in_the_order_that_lets_every_node_report_2(
        environ: dict[str, str], wait_s: float) -> None:
    from prudent.kernel.stop import refusal_exit_wait_s

    assert refusal_exit_wait_s(environ) == wait_s


# ...under a launcher whose error file names a worker it SIGTERMed itself (-15) once rank 0
# had exited 75 (torchrun, 4 ranks on a busy machine), then exits 1
KILLED_SIBLING = """
import json, os, subprocess, sys
subprocess.call([sys.executable, "-c", sys.argv[1], sys.argv[2]])
error = {"message": {"message": "", "errorCode": -15}}
json.dump(error, open(os.environ["TORCHELASTIC_ERROR_FILE"], "w"))
sys.exit(1)
"""


def test_a_worker_torchrun_killed_after_another_stopped_does_not_hide_the_records_code(
        settings: ProjectSettings) -> None:
    command = [sys.executable, "-c", KILLED_SIBLING, TRAIN, "preempted"]
    assert Supervisor(command, settings, run_id="killed").run() == 75
