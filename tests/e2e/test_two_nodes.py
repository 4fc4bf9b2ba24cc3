"""Two nodes on one machine (two torchrun agents meeting at a c10d rendezvous, each under its
own ``prudent run`` with its own project folder, home and store): one job, one run id, every
node on one checkpoint location; a location the nodes do not share is refused before any
step is trained."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import assert_identical, final_state

ITERS = 2000
# this long on 512 samples the loss spikes as the model fits them: rules are not the subject
QUIET = {"PRUDENT_CONSOLE": "off", "PRUDENT_MONITOR": "false"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node_command(port: int, *args: str) -> list[str]:
    return ["run", *args, "--", sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "twonodes",
            script("ddp_rank_seeds.py")]


def nodes(root: Path, checkpoints: dict[str, str]) -> list[Project]:
    made = []
    for name in ("node-a", "node-b"):
        node = Project(root / name)
        node.path.mkdir()
        node.env.update({"PRUDENT_HOST": name, "PRUDENT_CHECKPOINT_URL": checkpoints[name],
                         **QUIET})
        made.append(node)
    return made


def launch(both: list[Project], port: int, *args: str) -> list[subprocess.Popen[str]]:
    return [subprocess.Popen([sys.executable, "-m", "prudent", *node_command(port, *args)],
                             cwd=node.path, env=node.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) for node in both]


def finish(running: list[subprocess.Popen[str]], timeout: float) -> tuple[list[int], str]:
    """Each ``prudent run``'s exit code, and their error output together."""
    errors = [p.communicate(timeout=timeout)[1] for p in running]
    return [p.returncode for p in running], "".join(errors)


def steps_logged(both: list[Project]) -> int:
    logs = [n.path / f"rank{r}.log" for n in both for r in (0, 1)]
    return max((len(log.read_text().splitlines()) for log in logs if log.exists()), default=0)


class SharedLocation:
    """Where both nodes keep the job's checkpoints and record: a folder both see, or a bucket
    on the loopback S3 server (moto's), as a cloud job would."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.env: dict[str, str] = {}
        self.fs: Any = None
        if request.param == "folder":
            self.url = str(tmp_path / "shared-checkpoints")
            return
        import s3fs

        endpoint = request.getfixturevalue("s3_endpoint")
        self.fs = s3fs.S3FileSystem(key="testing", secret="testing",
                                    client_kwargs={"endpoint_url": endpoint})
        bucket = f"bucket-{uuid.uuid4().hex[:8]}"
        self.fs.mkdir(bucket)
        self.url = f"s3://{bucket}/prudent-checkpoints"
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": endpoint}

    def names(self, folder: str = "") -> list[str]:
        path = f"{self.url}/{folder}".rstrip("/")
        if self.fs is None:
            return [p.name for p in Path(path).iterdir()]
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, refresh=True)]


@pytest.fixture(params=["folder", "s3"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> SharedLocation:
    return SharedLocation(request, tmp_path)


@pytest.mark.slow
def test_two_nodes_stopped_and_relaunched_are_one_job_ending_bit_identical(
        project: Project, tmp_path: Path, shared: SharedLocation) -> None:
    project.env.update(QUIET)
    reference = project.prudent(
        "run", "--run-id", "reference", "--set", f"iters={ITERS}", "--set", "out=ref.pt", "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        script("ddp_rank_seeds.py"), timeout=300)
    assert reference.returncode == 0, reference.stderr

    both = nodes(tmp_path, {"node-a": shared.url, "node-b": shared.url})
    for node in both:
        node.env.update(shared.env)
    port = free_port()
    first = launch(both, port, "--set", f"iters={ITERS}")
    deadline = time.monotonic() + 120
    while steps_logged(both) < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    for supervisor in first:  # both machines get their preemption notice
        supervisor.send_signal(signal.SIGTERM)
    codes, errors = finish(first, 120)
    # rank 0's node from the record; the other from its ranks' own code, through torchrun
    assert codes == [75, 75], errors
    assert steps_logged(both) < ITERS

    second = launch(both, free_port(), "--set", f"iters={ITERS}", "--set", "out=final.pt")
    codes, errors = finish(second, 300)
    assert codes == [0, 0], errors
    final = next(n.path / "final.pt" for n in both if (n.path / "final.pt").exists())
    assert_identical(final_state(project.path / "ref.pt"), final_state(final))
    # one run id on both nodes (from --rdzv-id), its record in the shared location
    ids = {run["id"] for n in both for run in json_runs(n)}
    assert ids == {"ddp-rank-seeds-twonodes"}
    assert shared.names("record")
    assert [name for name in shared.names() if name.startswith("ckpt-")]


@pytest.mark.slow
def test_a_checkpoint_folder_each_node_keeps_to_itself_is_refused(tmp_path: Path) -> None:
    both = nodes(tmp_path, {"node-a": str(tmp_path / "a-disk"), "node-b": str(tmp_path / "b-disk")})
    running = launch(both, free_port(), "--set", f"iters={ITERS}")
    codes, errors = finish(running, 300)
    assert codes == [2, 2], errors
    assert "is not shared by the job's 2 nodes" in errors
    assert steps_logged(both) == 0  # nothing trained


def json_runs(node: Project) -> list[dict[str, str]]:
    import json

    listed = node.prudent("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)
