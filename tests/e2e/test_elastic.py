"""Elastic restart (issue 34, level 1): two "machines" on one host (two torchrun agents at a
c10d rendezvous, `--nnodes 1:2`, each under its own `prudent run` with its own folder, home
and store, one shared checkpoint folder). One machine's whole process tree is SIGKILLed mid-run:
the other goes on alone after torchrun restarts its worker (resumed from the newest
checkpoint, the epoch's rest dealt over one rank); the killed machine, started again, joins
at the next rendezvous and the job grows back to two ranks. Every sample of the interrupted
epoch is trained exactly once, the final validation loss is within 2% of an uninterrupted
two-rank run's, and the record says who left and who joined."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import Project, script
from tests.e2e.test_two_nodes import free_port

# torchrun's defaults but the last call (how long a rendezvous that has its minimum waits
# for more machines): a dead machine is dropped after its agent misses 3 keep-alives of 5 s
RDZV_CONF = "last_call_timeout=2"


def elastic_node(root: Path, name: str, shared: Path, logs: Path, port: int) -> tuple[
        Project, list[str]]:
    node = Project(root / name)
    node.path.mkdir(exist_ok=True)
    node.env.update({"PRUDENT_HOST": name, "PRUDENT_CHECKPOINT_URL": str(shared),
                     "LOG_DIR": str(logs), "PRUDENT_CHECKPOINT_EVERY": "10steps",
                     "PRUDENT_CONSOLE": "off", "PRUDENT_MONITOR": "false",
                     # restarted workers on gloo need their own store (research/scale-out.md)
                     "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    command = ["run", "--set", "step_sleep_s=0.03", "--", sys.executable, "-m",
               "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "elastic", "--max-restarts", "3", "--rdzv-conf", RDZV_CONF,
               script("elastic_train.py")]
    return node, command


def start(node: Project, command: list[str]) -> subprocess.Popen[str]:
    """``prudent run`` on the machine; its error output appended to ``stderr.txt`` there."""
    with open(node.path / "stderr.txt", "a") as errors:
        return subprocess.Popen([sys.executable, "-m", "prudent", *command], cwd=node.path,
                                env=node.env, stdout=subprocess.DEVNULL, stderr=errors,
                                text=True, start_new_session=True)


def logged(logs: Path) -> list[list[str]]:
    path = logs / "samples.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(condition: object, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def history(lines: list[list[str]]) -> dict[int, dict[str, list[str]]]:
    """Step -> what each rank trained at that step, in the job's final history: a step a
    later world trained again (after resuming from an earlier checkpoint) replaces it."""
    steps: dict[int, dict[str, list[str]]] = {}
    owners: dict[int, tuple[str, str]] = {}
    for start_step, step, world, rank, epoch, *indices in lines:
        attempt = (start_step, world)
        if owners.get(int(step)) != attempt:
            owners[int(step)], steps[int(step)] = attempt, {}
        steps[int(step)][rank] = [world, epoch, *indices]
    return steps


@pytest.mark.slow
def test_a_machine_killed_mid_run_leaves_and_rejoins_and_the_job_goes_on(
        project: Project, tmp_path: Path) -> None:
    project.env.update({"PRUDENT_CONSOLE": "off", "PRUDENT_MONITOR": "false",
                        "LOG_DIR": str(project.path)})
    reference = project.prudent("run", "--", sys.executable, "-m", "torch.distributed.run",
                                "--standalone", "--nproc-per-node", "2",
                                script("elastic_train.py"), timeout=300)
    assert reference.returncode == 0, reference.stderr
    expected = json.loads((project.path / "val.json").read_text())["val_loss"]

    shared, logs, port = tmp_path / "shared-checkpoints", tmp_path / "logs", free_port()
    logs.mkdir()
    node_a, command_a = elastic_node(tmp_path, "node-a", shared, logs, port)
    node_b, command_b = elastic_node(tmp_path, "node-b", shared, logs, port)
    first_a = start(node_a, command_a)
    time.sleep(1.0)  # node-a's agent hosts the rendezvous (a torchrun limit: see the docs)
    first_b = start(node_b, command_b)
    wait_for(lambda: len(logged(logs)) >= 80, 120, "40 steps on two ranks")
    tree = [psutil.Process(first_b.pid), *psutil.Process(first_b.pid).children(recursive=True)]
    for process in tree:  # the machine is gone: prudent run, torchrun and its worker at once
        process.send_signal(signal.SIGKILL)
    first_b.wait()
    killed_at = len(logged(logs))
    alone_s = wait_for(lambda: any(line[2] == "1" for line in logged(logs)[killed_at:]), 120,
                       "the survivor's next step on one rank")
    time.sleep(2.0)
    again_b = start(node_b, command_b)
    regrown = len(logged(logs))
    wait_for(lambda: any(line[2] == "2" for line in logged(logs)[regrown:]), 120,
             "the job on two ranks again")
    codes = [first_a.wait(timeout=300), again_b.wait(timeout=300)]
    assert codes == [0, 0], [(n.path / "stderr.txt").read_text()[-3000:] for n in (node_a, node_b)]

    steps = history(logged(logs))
    assert sorted(steps) == list(range(1, max(steps) + 1))  # no step missing
    worlds = [next(iter(steps[s].values()))[0] for s in sorted(steps)]
    changes = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
    assert changes == ["2", "1", "2"], changes  # left, went on alone, grew back
    trained: Counter[int] = Counter()
    for ranks in steps.values():
        for world, epoch, *indices in ranks.values():
            if epoch == "0":
                trained.update(int(i) for i in indices)
    assert sorted(trained) == list(range(1024)) and set(trained.values()) == {1}
    final = json.loads((logs / "val.json").read_text())
    assert final["world"] == 2 and final["val_loss"] == pytest.approx(expected, rel=0.02)

    events = [e for node in (node_a, node_b) for e in node.show("elastic-train-elastic")["events"]
              if e["kind"] == "lifecycle" and e["name"] in ("rank_lost", "membership")]
    messages = " | ".join(e["message"] for e in events)
    assert any(e["name"] == "rank_lost" for e in events), messages
    assert "node-b left" in messages and "node-b joined" in messages, messages
    # the meter bills each attempt for the machines torchrun gave it: 2, then 1, then 2
    priced = [e["message"] for node in (node_a, node_b)
              for e in node.show("elastic-train-elastic")["events"] if e["name"] == "price"]
    assert any("1 node (from torchrun)" in m for m in priced), priced
    assert any("2 nodes (from torchrun)" in m for m in priced), priced
    shown = node_a.prudent("show", "elastic-train-elastic")  # as a person reads it
    assert shown.returncode == 0 and "membership" in shown.stdout, shown.stderr
    lines = logged(logs)
    alone = next(i for i, line in enumerate(lines) if line[2] == "1")
    lost = max(int(line[1]) for line in lines[:alone]) - int(lines[alone][0])
    print(f"kill -> the survivor's next step {alone_s:.1f} s; steps lost {lost}")
