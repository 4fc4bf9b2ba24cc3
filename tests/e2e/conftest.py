from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parents[2]


class Project:
    """A project folder where the tests run prudent commands as a user would."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
        self.env["PRUDENT_CONSOLE"] = "plain"

    def prudent(self, *args: str, timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "prudent", *args], cwd=self.path, env=self.env,
                              capture_output=True, text=True, timeout=timeout, **kwargs)

    def python(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], cwd=self.path, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def show(self, run: str) -> dict[str, Any]:
        result = self.prudent("show", run, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


def script(name: str) -> str:
    return str(SCRIPTS / name)


def torchrun_command(name: str, num_ranks: int = 2) -> list[str]:
    """torchrun on this machine (``--standalone``) running the e2e script ``name``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(num_ranks), script(name)]


def child_of(supervisor: subprocess.Popen[str], previous: int | None,
             timeout: float = 60) -> psutil.Process:
    """The training process ``prudent run`` launched (a new one, not ``previous``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = [p for p in psutil.Process(supervisor.pid).children() if p.pid != previous]
        if kids:
            return kids[0]
        time.sleep(0.02)
    raise AssertionError("prudent run did not relaunch the training process")


def two_machines(root: Path, checkpoint: str) -> tuple[Project, Project]:
    """A spot VM and the one that replaces it: two project folders (each its own disk and home)
    whose checkpoints go to one shared folder standing in for the bucket. ``checkpoint``: the
    rest of the ``checkpoint:`` section (``every: 5steps``)."""
    bucket = root / "bucket"
    machines = []
    for name in ("old", "new"):
        machine = Project(root / name)
        machine.path.mkdir()
        (machine.path / "prudent.yaml").write_text(
            f"checkpoint: {{url: '{bucket}', {checkpoint}}}\n")
        machines.append(machine)
    return machines[0], machines[1]


def steps_trained(machine: Project) -> list[int]:
    """The steps the training scripts wrote to this machine's steps.log ("<pid> <step>")."""
    return [int(line.split()[1])
            for line in (machine.path / "steps.log").read_text().splitlines()]


def s3_bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the S3 server at ``endpoint`` (moto), with its test credentials."""
    import s3fs

    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(var, value)
    name = f"bucket-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}).mkdir(name)
    return name
