"""Two replica groups under torchft (``prudent[ft]``), each its own machine: its own project
folder, home and store, one shared checkpoint folder, one real lighthouse. One group is
SIGKILLed mid-run: the other trains on in the same process without reading a checkpoint;
started again, the killed group takes the live one's weights and the two finish together.
The figures (kill to the survivor's next committed step, steps lost, heal time) are printed:
``pytest tests/e2e/test_torchft.py -m slow -s``."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prudent.store.database import Store
from tests.e2e.conftest import ROOT, Project

pytest.importorskip("torchft", reason="pip install 'prudent[ft]'")

EXAMPLE = ROOT / "examples" / "fault_tolerant" / "train.py"
# a model big enough that a step's compute outweighs the quorum's round trips, so the group
# left alone does not race through the steps meant for after the rejoin (one thread each:
# two groups on 2 cores): about 20 ms a step alone, 30 ms together, here
CONFIG = {"steps": 600, "hidden": 1024, "batch_size": 256, "eval_every": 25}
ENV = {"PRUDENT_CONSOLE": "off", "PRUDENT_MONITOR": "false", "PRUDENT_CHECKPOINT_EVERY": "50steps",
       "OMP_NUM_THREADS": "1", "RUST_LOG": "warn", "PRUDENT_SET": json.dumps(CONFIG)}


class Machine:
    """One replica group's machine: a project folder whose script joins the lighthouse."""

    def __init__(self, root: Path, group: int, lighthouse: str, shared: Path) -> None:
        self.group, self.run_id = group, f"digits-ft-replica{group}"
        self.project = Project(root / f"machine{group}")
        self.project.path.mkdir()
        self.project.env.update(ENV, PRUDENT_CHECKPOINT_URL=f"{shared}/{{run_id}}",
                                PRUDENT_RUN_ID=self.run_id, REPLICA_GROUP_ID=str(group),
                                TORCHFT_LIGHTHOUSE=lighthouse)
        self.database = self.project.path / ".prudent" / "prudent.db"
        self._store: Store | None = None
        self.process: subprocess.Popen[str] | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(f"sqlite:///{self.database}")
        return self._store

    def start(self) -> subprocess.Popen[str]:
        self.process = subprocess.Popen(
            [sys.executable, str(EXAMPLE)], cwd=self.project.path, env=self.project.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self.process

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        if not self.database.exists():  # the run is not registered yet
            return []
        return [e for e in self.store.events(self.run_id)
                if name is None or (e["kind"], e["name"]) == ("lifecycle", name)]

    def series(self, metric: str) -> dict[int, float]:
        return dict(self.store.metric_series(self.run_id, metric))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def lighthouse() -> Iterator[str]:
    """torchft's lighthouse (its Rust binary, as on a host of its own): a quorum of at least
    one group; a group whose heartbeat stops for 1 s is dead; a group that heartbeats is
    waited for up to 1 s. The groups retry until it listens."""
    port = free_port()
    binary = Path(sys.executable).parent / "torchft_lighthouse"
    server = subprocess.Popen(
        [str(binary), "--min_replicas", "1", "--bind", f"[::]:{port}", "--join_timeout_ms",
         "1000", "--heartbeat_timeout_ms", "1000"], env={**os.environ, "RUST_LOG": "warn"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield f"http://localhost:{port}"
    server.terminate()
    server.wait()


def wait_for(condition: Callable[[], Any], what: str, machines: list[Machine],
             timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        for m in machines:
            if m.process is not None and m.process.poll() is not None:
                raise AssertionError(f"replica group {m.group} exited {m.process.returncode} "
                                     f"while waiting for {what}: {m.process.communicate()[1]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_killed_replica_group_leaves_the_other_training_and_rejoins_from_its_weights(
        tmp_path: Path, lighthouse: str) -> None:
    survivor, victim = (Machine(tmp_path, g, lighthouse, tmp_path / "shared") for g in (0, 1))
    try:
        killed_at, left, outputs = _kill_and_restart(survivor, victim)
    finally:
        for m in (survivor, victim):
            if m.process is not None and m.process.poll() is None:
                m.process.kill()
                m.process.communicate()
    figures = _survivor_went_on(survivor, killed_at, left)
    figures.update(_victim_healed(victim, killed_at, left))
    _one_model(survivor, victim, figures["healed_at"], outputs)
    _no_jump_in_the_loss(survivor, victim, figures)
    # prudent show lists the membership changes
    shown = [e["payload"] for e in survivor.project.show(survivor.run_id)["events"]
             if e["name"] == "membership"]
    assert [(p["left"], p["joined"]) for p in shown][-2:] == [([1], []), ([], [1])], shown
    print("\ntorchft figures:", json.dumps(figures))


def _kill_and_restart(survivor: Machine, victim: Machine
                      ) -> tuple[float, dict[str, Any], dict[int, str]]:
    """Both train; the victim is SIGKILLed, then started again once the survivor dropped it;
    both run to the end. The kill's time, the survivor's ``left`` event, each one's stdout."""
    both = [survivor, victim]
    pid = survivor.start().pid
    victim.start()
    # both train together, and the victim has a checkpoint of its own it could resume from
    wait_for(lambda: any(e["payload"]["world_size"] == 2 for e in survivor.events("membership"))
             and any(e["name"] == "saved" for e in victim.events()), "both groups", both)
    victim.process.kill()  # type: ignore[union-attr]  # SIGKILL: no clean exit, no last save
    killed_at = time.time()
    victim.process.communicate()  # type: ignore[union-attr]
    victim.process = None
    left = wait_for(lambda: [e for e in survivor.events("membership") if e["payload"]["left"]],
                    "the survivor to drop the victim", both)[0]
    victim.start()  # the same machine, the same run id: a restart
    out = {m.group: m.process.communicate(timeout=120) for m in both}  # type: ignore[union-attr]
    codes = {m.group: m.process.returncode for m in both}  # type: ignore[union-attr]
    assert codes == {0: 0, 1: 0}, out
    assert survivor.process.pid == pid  # type: ignore[union-attr]
    return killed_at, left, {group: stdout for group, (stdout, _) in out.items()}


def _survivor_went_on(survivor: Machine, killed_at: float, left: dict[str, Any]
                      ) -> dict[str, Any]:
    """One process from start to end, no checkpoint read, a step committed soon after."""
    events = survivor.events()
    assert [e["name"] for e in events if e["name"] in ("start", "end")] == ["start", "end"]
    assert not [e for e in events if e["name"] in ("resumed", "restored")]
    assert left["payload"]["left"] == [1] and left["payload"]["replica_groups"] == [0]
    dropped = survivor.events("not_committed")
    assert not [d for d in dropped  # the step that saw the new quorum was committed
                if d["payload"]["first_step"] <= left["step"] <= d["payload"]["last_step"]]
    rejoined = survivor.events("membership")[-1]
    assert rejoined["payload"]["joined"] == [1] and rejoined["step"] > left["step"]
    assert rejoined["payload"]["replica_groups"] == [0, 1]
    to_next_commit_s = left["wall"] - killed_at
    assert to_next_commit_s < 10, events
    return {"kill_to_next_commit_s": round(to_next_commit_s, 3),
            "steps_lost": sum(d["payload"]["num_steps"] for d in dropped),
            "kill_step": max(s for s, w in _walls(survivor, "loss") if w <= killed_at),
            "left_step": left["step"], "alone_steps": rejoined["step"] - left["step"]}


def _victim_healed(victim: Machine, killed_at: float, left: dict[str, Any]) -> dict[str, Any]:
    """Restarted, it resumed from its own checkpoint, then took the survivor's state."""
    restart = [e for e in victim.events() if e["wall"] > killed_at]
    resumed = [e for e in restart if e["name"] == "resumed"]
    healed = [e for e in restart if e["name"] == "healed"]
    assert resumed and len(healed) == 1, restart  # (its first start may have healed too)
    heal = healed[0]
    assert heal["payload"]["source"] == 0 and heal["step"] > left["step"]
    assert heal["payload"]["from_step"] < heal["step"] - 1  # it was behind, and is not now
    return {"heal_s": round(heal["payload"]["heal_s"], 4), "healed_at": heal["step"],
            "healed_from_checkpoint_step": heal["payload"]["from_step"]}


def _one_model(survivor: Machine, victim: Machine, healed_at: int,
               outputs: dict[int, str]) -> None:
    """The same weights at every evaluation after the heal, and at the end."""
    mine, theirs = survivor.series("weights_sum"), victim.series("weights_sum")
    after = sorted(s for s in mine if s >= healed_at and s in theirs)
    assert after and all(mine[s] == theirs[s] for s in after), (mine, theirs)
    assert outputs[0].split("weights_sum")[1] == outputs[1].split("weights_sum")[1], outputs


def _no_jump_in_the_loss(survivor: Machine, victim: Machine, figures: dict[str, Any]) -> None:
    """The survivor's loss around the kill; the healed group's from the heal on, which is
    the survivor's, not a fresh model's."""
    loss, healer_loss = survivor.series("loss"), victim.series("loss")
    kill_step, left_step = figures["kill_step"], figures["left_step"]
    before = statistics.mean(loss[s] for s in range(kill_step - 19, kill_step + 1))
    after = statistics.mean(loss[s] for s in range(left_step, left_step + 20))
    assert after < 1.5 * before + 0.05, loss
    healed = [s for s in range(figures["healed_at"], figures["healed_at"] + 20)
              if s in healer_loss]
    first_loss = loss[min(loss)]
    assert statistics.mean(healer_loss[s] for s in healed) < 0.5 * first_loss
    assert abs(statistics.mean(healer_loss[s] for s in healed)
               - statistics.mean(loss[s] for s in healed)) < 0.5 * first_loss


def _walls(machine: Machine, metric: str) -> list[tuple[int, float]]:
    """Each step's end time (time.time()) as the run recorded it."""
    import sqlalchemy as sa

    from prudent.store.database import metrics

    with machine.store.engine.connect() as conn:
        rows = conn.execute(sa.select(metrics.c.step, metrics.c.wall).where(
            metrics.c.run_id == machine.run_id, metrics.c.name == metric)).all()
    return [(step, wall) for step, wall in rows]
