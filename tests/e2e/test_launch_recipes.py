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

The multi-node recipes run two "nodes" on this machine: two ``prudent run`` over two torchrun
agents meeting at a c10d rendezvous on loopback, one rank each, DDP on gloo, sharing a run
store (a SQLite file stands in for the PostgreSQL database) and the checkpoint location.

- SLURM, two nodes: the batch script with stand-ins for ``srun`` (one task per node, the
  highest code), ``scontrol`` and ``scancel`` (the signal to every process of the step).
- SkyPilot, two nodes: the ``run`` block on each node with SkyPilot's variables; a
  preemption's SIGTERM to every process of both; checkpoints on S3.

Grace periods are shortened to GRACE_S: the run must be gone long before.
"""

from __future__ import annotations

import json
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

from prudent.kernel.stop import ExitCode
from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import attempts
from tests.e2e.test_two_nodes import free_port
from tests.test_launch_recipes import (
    FAKE_SCANCEL,
    FAKE_SCONTROL,
    FAKE_SRUN,
    KUBERNETES,
    SAGEMAKER_ENTRY,
    SKYPILOT,
    SKYPILOT_MULTINODE,
    SLURM,
    SLURM_MULTINODE,
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
NODES_STEPS = 48
NODES_TRAIN_PY = f"""\"\"\"The multi-node recipes' train.py: DDP on CPU (gloo), one process per node; each
rank appends "<pid> <step>" to steps-rank<r>.log before run.step; {NODES_STEPS} steps of 50 ms,
so that a signal lands mid-run.\"\"\"
import os, time
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import prudent

torch.set_num_threads(1)
dist.init_process_group("gloo")
run = prudent.init(name="train")
rank = dist.get_rank()
torch.manual_seed(0)
features = torch.randn({NODES_STEPS * 8}, 8)
dataset = TensorDataset(features, (features[:, 0] > 0).long())
loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, seed=1))
model = DistributedDataParallel(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.attach(model=model, optimizer=opt)
with run, open(f"steps-rank{{rank}}.log", "a") as log:
    for epoch in run.epochs(1):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            log.write(f"{{os.getpid()}} {{run.state.step + 1}}\\n")
            log.flush()
            run.step(loss=loss)
            time.sleep(0.05)
dist.destroy_process_group()
"""


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
                             interrupt: Interrupt, *, new_machine: bool, log: str = "steps.log"
                             ) -> tuple[subprocess.CompletedProcess[str], str]:
    """Launch ``command``, interrupt it mid-run, SIGKILL its process group after GRACE_S; check
    the clean stop and its checkpoint at ``location``, then launch it again, on a ``new_machine``
    (an empty PRUDENT_HOME: only ``location`` survives) or the same one. Returns the second
    launch and the first's stop message."""
    first = subprocess.Popen(command, cwd=project.path, env=project.env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    wait_for_steps(project.path / log, [first])
    interrupt(first)
    try:
        _, err = first.communicate(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(first.pid, signal.SIGKILL)  # the platform's kill at the end of the grace
        first.communicate()
        pytest.fail(f"still running {GRACE_S} s after the signal: the platform would SIGKILL it")
    assert first.returncode == 75, err
    stop = assert_stopped_with_a_checkpoint(project, run_id, location)

    if new_machine:
        project.env["PRUDENT_HOME"] = str(project.path / "machine-2" / ".prudent")
    second = subprocess.run(command, cwd=project.path, env=project.env, text=True,
                            capture_output=True, timeout=120)
    return second, stop


def wait_for_steps(log: Path, launched: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) >= STEPS_BEFORE_SIGNAL):
        for process in launched:
            assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.02)


def assert_stopped_with_a_checkpoint(project: Project, run_id: str, location: str) -> str:
    """The run's record says preempted, with a checkpoint at ``location``; returns the stop
    message."""
    shown = project.show(run_id)
    assert (shown["status"], shown["stop_reason"]) == ("stopped", "preempted"), shown
    saved = [e["payload"]["path"] for e in shown["events"] if e["name"] == "saved"]
    assert saved and location.removeprefix("s3://") in saved[-1], (location, saved)
    stops = [e["message"] for e in shown["events"] if "received: stopping" in (e["message"] or "")]
    assert stops, shown["events"]
    return str(stops[0])


def assert_continued(project: Project, run_id: str, second: subprocess.CompletedProcess[str],
                     logs: tuple[str, ...] = ("steps.log",), steps: int = 24) -> None:
    assert second.returncode == 0, second.stderr
    for log in logs:
        before, after = attempts(project.path / log)
        assert after[0] == before[-1] + 1 and after[-1] == steps  # no step redone, none skipped
    shown = project.show(run_id)
    assert shown["status"] == "completed"
    if "PRUDENT_HOME" not in project.env and len(logs) == 1:  # the same machine's record
        assert shown["restarts"] == 1  # counts the relaunch (several nodes: each counts itself)
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


# several nodes --------------------------------------------------------------------------------
NODE_LOGS = ("steps-rank0.log", "steps-rank1.log")


@pytest.fixture
def nodes_cloud(cloud: Project) -> Project:
    """``cloud`` with the multi-node train.py and one run store every node shares."""
    (cloud.path / "train.py").write_text(NODES_TRAIN_PY)
    shared = cloud.path / "shared-store"
    shared.mkdir()
    cloud.env.update(PRUDENT_STORE_URL=f"sqlite:///{shared / 'prudent.db'}", OMP_NUM_THREADS="1")
    return cloud


def _fake_slurm(project: Project) -> Path:
    """srun, scontrol and scancel stand-ins on the PATH; returns their log folder."""
    fake_bin, log = project.path / "slurm-bin", project.path / "slurm-log"
    fake_bin.mkdir()
    log.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("scancel", FAKE_SCANCEL)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod((fake_bin / name).stat().st_mode | stat.S_IXUSR)
    project.env.update(PATH=f"{fake_bin}{os.pathsep}{project.env['PATH']}", FAKE_LOG=str(log),
                       FAKE_HOSTS="127.0.0.1")
    return log


@pytest.mark.slow
def test_slurm_two_nodes_usr1_requeues_and_the_requeued_job_resumes_on_both(
        nodes_cloud: Project) -> None:
    log = _fake_slurm(nodes_cloud)
    nodes_cloud.env.update(SLURM_JOB_ID="4242", SLURM_NNODES="2", SLURM_JOB_NODELIST="node-[a-b]",
                           SLURM_GPUS_ON_NODE="1", RDZV_PORT=str(free_port()))
    checkpoints = str(nodes_cloud.path / "checkpoints" / "slurm-4242")  # the script's default
    second, stop = interrupted_then_resumed(
        nodes_cloud, ["bash", str(SLURM_MULTINODE)], "slurm-4242", checkpoints,
        sigusr1_batch_shell, new_machine=False, log=NODE_LOGS[0])
    assert stop.startswith("SIGTERM received")  # scancel --signal=TERM to the step
    assert (log / "scancel").read_text() == "--signal=TERM 4242\n"
    assert (log / "scontrol").read_text() == "requeue 4242\n"
    assert_continued(nodes_cloud, "slurm-4242", second, NODE_LOGS, NODES_STEPS)
    assert (log / "scontrol").read_text() == "requeue 4242\n"  # not again on success
    assert _run_ids(nodes_cloud) == ["slurm-4242"]  # no node's own run


@pytest.mark.slow
def test_skypilot_two_nodes_preempted_on_spot_resume_from_the_bucket(
        nodes_cloud: Project, bucket: str) -> None:
    task = yaml.safe_load(SKYPILOT_MULTINODE.read_text())
    task_id = "sky-managed-2026-12-03-07-00-00-000000_train_1-0"  # the same on recovery
    nodes_cloud.env.update({**task["envs"], "SKYPILOT_TASK_ID": task_id, "CHECKPOINT_ROOT": bucket,
                            "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "1",
                            "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1",
                            "RDZV_PORT": str(free_port())})
    first = _skypilot_nodes(nodes_cloud, task["run"])
    wait_for_steps(nodes_cloud.path / NODE_LOGS[0], first)
    for node in first:  # the spot VMs' shutdown
        sigterm_every_process(node)
    codes, errors = _finish_nodes(first, GRACE_S)
    assert codes == [ExitCode.PREEMPTED] * 2, errors  # recover_on_exit_codes: any node's 75
    assert_stopped_with_a_checkpoint(nodes_cloud, task_id, f"{bucket}/{task_id}")

    nodes_cloud.env["PRUDENT_HOME"] = str(nodes_cloud.path / "new-vms" / ".prudent")
    nodes_cloud.env["RDZV_PORT"] = str(free_port())
    codes, errors = _finish_nodes(_skypilot_nodes(nodes_cloud, task["run"]), 120)
    assert codes == [0, 0], errors
    assert_continued(nodes_cloud, task_id, subprocess.CompletedProcess([], 0), NODE_LOGS,
                     NODES_STEPS)
    assert _run_ids(nodes_cloud) == [task_id]


def _skypilot_nodes(project: Project, run_block: str) -> list[subprocess.Popen[str]]:
    """The ``run`` block on each node, as SkyPilot starts it (SKYPILOT_NODE_RANK 0, 1)."""
    return [subprocess.Popen(["bash", "-c", run_block], cwd=project.path, text=True,
                             env={**project.env, "SKYPILOT_NODE_RANK": str(rank)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
            for rank in (0, 1)]


def _finish_nodes(nodes: list[subprocess.Popen[str]], timeout: float) -> tuple[list[int], str]:
    """Each node's exit code (SIGKILL to the ones still running after ``timeout``: the
    platform's kill), and their error output together."""
    errors = []
    for node in nodes:
        try:
            errors.append(node.communicate(timeout=timeout)[1][-3000:])
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.communicate()
            pytest.fail(f"a node still ran {timeout} s after the signal")
    return [node.returncode for node in nodes], "\n".join(errors)


def _run_ids(project: Project) -> list[str]:
    listed = project.prudent("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    return [run["id"] for run in json.loads(listed.stdout)]
