"""Each launch recipe's command, interrupted the way its platform interrupts, against a real
training run: it exits 75 before the platform's SIGKILL, the run is recorded ``stopped`` /
``preempted`` with a checkpoint where the recipe keeps them, and the same command started
again (the platform's relaunch: on a new machine with an empty disk, except on SLURM, whose
nodes share the submit folder) continues from that checkpoint, redoing no step, and completes.

- SkyPilot (a spot VM's shutdown): SIGTERM to every process, SIGKILL after the grace period;
  checkpoints on S3 (a real S3-compatible server on loopback stands in for the bucket).
- Kubernetes: SIGTERM to the container's main process, SIGKILL after
  terminationGracePeriodSeconds; checkpoints on S3.
- SageMaker: SIGTERM to the entry point, SIGKILL 120 s later; a folder stands in for
  /opt/ml/checkpoints.
- SLURM: SIGUSR1 to the batch script only (``--signal=B:USR1@120``), SIGKILL to the job at
  the time limit; the script's ``scontrol requeue`` is recorded by a stand-in ``scontrol``.

Grace periods are shortened to GRACE_S: the run must be gone long before.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import attempts
from tests.test_launch_recipes import (
    KUBERNETES,
    SAGEMAKER_ENTRY,
    SKYPILOT,
    SLURM,
)

GRACE_S = 20.0
STEPS_BEFORE_SIGNAL = 8
TRAIN_PY = f"""\"\"\"The recipes' train.py: {script("resume_train.py")}, slowed so that a signal
lands mid-run (24 steps of 30 ms).\"\"\"
import json, os, runpy
os.environ["PRUDENT_SET"] = json.dumps({{"epochs": 1, "sleep_s": 0.03, "workers": 0}})
runpy.run_path({script("resume_train.py")!r}, run_name="__main__")
"""
Interrupt = Callable[[subprocess.Popen[str]], None]


@pytest.fixture
def cloud(project: Project) -> Project:
    """A project whose train.py is a real resumable training, with `prudent` and `python` on
    the PATH as a platform's image would have them."""
    (project.path / "train.py").write_text(TRAIN_PY)
    venv_bin = str(Path(sys.executable).parent)
    project.env["PATH"] = f"{venv_bin}{os.pathsep}{project.env.get('PATH', '')}"
    return project


@pytest.fixture
def bucket(s3_endpoint: str, cloud: Project) -> str:
    """An empty bucket on the loopback S3 server, with the variables a pod or VM would have."""
    import s3fs

    name = f"bucket-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(key="testing", secret="testing",
                      client_kwargs={"endpoint_url": s3_endpoint}).mkdir(name)
    cloud.env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                      "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": s3_endpoint})
    return f"s3://{name}/prudent-checkpoints"


# the platforms' signals -----------------------------------------------------------------------
def sigterm_every_process(launched: subprocess.Popen[str]) -> None:
    """A VM's shutdown: every process gets SIGTERM (the training too, not only prudent run)."""
    tree = [psutil.Process(launched.pid), *psutil.Process(launched.pid).children(recursive=True)]
    for process in tree:
        process.send_signal(signal.SIGTERM)


def sigterm_main_process(launched: subprocess.Popen[str]) -> None:
    """The kubelet, SageMaker: SIGTERM to the container's main process."""
    launched.send_signal(signal.SIGTERM)


def sigusr1_batch_shell(launched: subprocess.Popen[str]) -> None:
    """SLURM's --signal=B:USR1@120: the batch shell, nothing else."""
    launched.send_signal(signal.SIGUSR1)


def interrupted_then_resumed(project: Project, command: list[str], run_id: str, location: str,
                             interrupt: Interrupt, *, new_machine: bool
                             ) -> tuple[subprocess.CompletedProcess[str], str]:
    """Launch ``command``, interrupt it mid-run, SIGKILL its process group after GRACE_S; check
    the clean stop and its checkpoint at ``location``, then launch it again, on a ``new_machine``
    (an empty PRUDENT_HOME: only ``location`` survives) or the same one. Returns the second
    launch and the first's stop message."""
    first = subprocess.Popen(command, cwd=project.path, env=project.env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    log = project.path / "steps.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) >= STEPS_BEFORE_SIGNAL):
        assert first.poll() is None, first.communicate()[1]
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.02)
    interrupt(first)
    try:
        _, err = first.communicate(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(first.pid, signal.SIGKILL)  # the platform's kill at the end of the grace
        first.communicate()
        pytest.fail(f"still running {GRACE_S} s after the signal: the platform would SIGKILL it")
    assert first.returncode == 75, err
    shown = project.show(run_id)
    assert (shown["status"], shown["stop_reason"]) == ("stopped", "preempted"), shown
    saved = [e["payload"]["path"] for e in shown["events"] if e["name"] == "saved"]
    assert saved and location.removeprefix("s3://") in saved[-1], (location, saved)
    stops = [e["message"] for e in shown["events"] if "received: stopping" in (e["message"] or "")]
    assert stops, shown["events"]

    if new_machine:
        project.env["PRUDENT_HOME"] = str(project.path / "machine-2" / ".prudent")
    second = subprocess.run(command, cwd=project.path, env=project.env, text=True,
                            capture_output=True, timeout=120)
    return second, stops[0]


def assert_continued(project: Project, run_id: str, second: subprocess.CompletedProcess[str]) -> None:
    assert second.returncode == 0, second.stderr
    before, after = attempts(project.path / "steps.log")
    assert after[0] == before[-1] + 1 and after[-1] == 24  # no step redone, none skipped
    shown = project.show(run_id)
    assert shown["status"] == "completed"
    if "PRUDENT_HOME" not in project.env:  # the same machine's record counts the relaunch
        assert shown["restarts"] == 1
    assert ("checkpoint", "resumed") in [(e["kind"], e["name"]) for e in shown["events"]]


# the recipes ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_skypilot_task_preempted_on_spot_resumes_from_the_bucket(cloud: Project, bucket: str) -> None:
    task = yaml.safe_load(SKYPILOT.read_text())
    task_id = "sky-managed-2026-12-03-07-00-00-000000_train_1-0"  # the same on recovery
    cloud.env.update(SKYPILOT_TASK_ID=task_id, CHECKPOINT_ROOT=bucket)  # sky jobs launch --env
    command = ["bash", "-c", task["run"]]
    second, _ = interrupted_then_resumed(cloud, command, task_id, f"{bucket}/{task_id}",
                                         sigterm_every_process, new_machine=True)
    assert_continued(cloud, task_id, second)


@pytest.mark.slow
def test_kubernetes_pod_terminated_resumes_in_a_new_pod(cloud: Project, bucket: str) -> None:
    job = yaml.safe_load(KUBERNETES.read_text())
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {"JOB_NAME": job["metadata"]["name"]}  # the label the downward API reads
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = _expand(var["value"], env)
    env = {**env, "CHECKPOINT_ROOT": bucket}
    env["PRUDENT_CHECKPOINT_URL"] = _expand("$(CHECKPOINT_ROOT)/$(JOB_NAME)", env)
    cloud.env.update(env)
    command = [_expand(arg, env) for arg in container["command"] + container.get("args", [])]
    run_id = job["metadata"]["name"]
    second, _ = interrupted_then_resumed(cloud, command, run_id, f"{bucket}/{run_id}",
                                         sigterm_main_process, new_machine=True)
    assert_continued(cloud, run_id, second)


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


@pytest.mark.slow
def test_sagemaker_spot_interruption_resumes_from_the_checkpoint_folder(cloud: Project) -> None:
    job_name = "prudent-train-20261203-070000"
    checkpoints = cloud.path / "opt-ml-checkpoints" / job_name  # /opt/ml/checkpoints/<run id>
    cloud.env.update(TRAINING_JOB_NAME=job_name, PRUDENT_CHECKPOINT_URL=str(checkpoints))
    command = ["sh", str(SAGEMAKER_ENTRY)]
    second, _ = interrupted_then_resumed(cloud, command, job_name, str(checkpoints),
                                         sigterm_main_process, new_machine=True)
    assert_continued(cloud, job_name, second)


@pytest.mark.slow
def test_slurm_usr1_before_the_time_limit_requeues_and_the_requeued_job_resumes(
        cloud: Project) -> None:
    fake_bin = cloud.path / "slurm-bin"
    fake_bin.mkdir()
    scontrol = fake_bin / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {cloud.path / "requeued"}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    cloud.env.update(SLURM_JOB_ID="4242", PATH=f"{fake_bin}{os.pathsep}{cloud.env['PATH']}")
    in_submit_folder = str(cloud.path / ".prudent" / "runs" / "slurm-4242" / "checkpoints")
    second, stop = interrupted_then_resumed(cloud, ["bash", str(SLURM)], "slurm-4242",
                                            in_submit_folder, sigusr1_batch_shell, new_machine=False)
    assert stop.startswith("SIGTERM received")  # the script turned SIGUSR1 into a SIGTERM
    assert (cloud.path / "requeued").read_text() == "requeue 4242\n"
    assert_continued(cloud, "slurm-4242", second)
    assert (cloud.path / "requeued").read_text() == "requeue 4242\n"  # not again on success
