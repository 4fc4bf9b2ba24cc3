"""prudent.fault_tolerant: torchft replica groups under a prudent run (two real groups, a
kill and a heal: tests/e2e/test_torchft.py)."""

from __future__ import annotations

import gc
import json
import math
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import prudent
from prudent.kernel.context import RunContext
from prudent.kernel.errors import ConfigError
from prudent.store.database import Store
from prudent.testing import make_settings, tiny_model
from tests.conftest import SESSION_THREADS

pytest.importorskip("torchft", reason="pip install 'prudent[ft]'")

from prudent.fault_tolerant import (  # noqa: E402 - only with torchft installed
    MANAGER_KEY,
    CommitOptimizer,
    FaultTolerantDDP,
    HealState,
    MembershipRecorder,
    QuorumGloo,
    replicate,
)


class RecordedEvents:
    """The run's record, as the writer receives it."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def put_event(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def names(self) -> list[str]:
        return [f"{r['kind']}/{r['name']}" for r in self.rows]


class FakeManager:
    """torchft's Manager, as the recorder and the optimizer ask it."""

    def __init__(self) -> None:
        self.participants, self.commit, self.error = 1, True, None
        self.quorums = 0
        self.shut_down: bool | None = None

    def num_participants(self) -> int:
        return self.participants

    def errored(self) -> Any:
        return self.error

    def should_commit(self) -> bool:
        return self.commit

    def start_quorum(self) -> None:
        self.quorums += 1

    def shutdown(self, wait: bool = True) -> None:
        self.shut_down = wait


def context(tmp_path: Path, events: RecordedEvents | None = None) -> RunContext:
    return RunContext(run_id="ft", name="ft", config={}, home=tmp_path, store=None,
                      writer=events, handle_signals=False)  # type: ignore[arg-type]


@pytest.fixture
def lighthouse() -> Iterator[str]:
    """A real lighthouse in this process (its threads are Rust's); torchft's timeout manager
    starts two threads for the rest of the process the first time a Manager waits."""
    from torchft.coordination import LighthouseServer

    # a group gone for 0.5 s is dead (the restarted group does not wait for its old self)
    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100,
                              heartbeat_timeout_ms=500)
    yield server.address()
    server.shutdown()
    SESSION_THREADS.update(t for t in threading.enumerate()
                           if t.name == "TimeoutManager" or t.name.endswith("(_watchdog_loop)"))


# torchft calls the deprecated Logger.warn when it reconfigures: under -W error that fails the
# quorum and no step would commit
@pytest.mark.filterwarnings("ignore:The 'warn' method is deprecated:DeprecationWarning")
def test_one_replica_group_trains_records_its_quorum_and_checkpoints_the_managers_step(
        tmp_path: Path, lighthouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "ft-replica0")  # a restart of the group: its own id

    def train(steps: int) -> tuple[int, int, str]:
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run = prudent.init(name="ft", exit_on_stop=False, model=model, optimizer=opt,
                           settings=make_settings(tmp_path, checkpoint={"every": "5steps"}))
        group = replicate(run, model, opt, replica_group=0, lighthouse=lighthouse)
        restored = group.manager.current_step()
        x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
        with run:
            for _ in run.steps(steps):
                group.optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(group.model(x), y)
                run.backward(loss)
                group.optimizer.step()
                run.step(loss=loss)
        return restored, run.state.step, run.status

    assert train(10) == (0, 10, "completed")
    collect_torchft_servers()
    store = Store.open(make_settings(tmp_path).store)
    events = [e for e in store.events("ft-replica0")
              if e["name"] in ("membership", "healed", "not_committed")]
    assert [(e["name"], e["step"], e["payload"]["joined"], e["payload"]["replica_groups"],
             e["payload"]["participants"]) for e in events] == [
        ("membership", 1, [0], [0], 1)]  # and every step committed
    # the Manager's committed steps ride in prudent's checkpoint: the restart starts there
    assert train(12) == (10, 12, "completed")
    collect_torchft_servers()


def collect_torchft_servers() -> None:
    """torchft 0.2.0's checkpoint server never closes its listening socket (the Manager's
    shutdown stops it only): collected here, where its ResourceWarning is expected."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_the_replica_group_and_the_lighthouse_are_asked_for_by_name(tmp_path: Path) -> None:
    run = prudent.init(name="ft", exit_on_stop=False, settings=make_settings(tmp_path))
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="REPLICA_GROUP_ID=N"):
        replicate(run, model, opt, lighthouse="http://localhost:1")
    with pytest.raises(ConfigError, match="TORCHFT_LIGHTHOUSE=http://HOST:29510"):
        replicate(run, model, opt, replica_group=1)
    run.context.finish("completed")


def test_a_checkpoint_url_every_group_would_write_is_refused(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, checkpoint={"url": str(tmp_path / "shared")})
    run = prudent.init(name="ft", exit_on_stop=False, settings=settings)
    model = tiny_model()
    with pytest.raises(ConfigError, match=r"put \{run_id\} in it .*PRUDENT_RUN_ID=<job>-replica1"):
        replicate(run, model, torch.optim.SGD(model.parameters(), lr=0.1), replica_group=1,
                  lighthouse="http://localhost:1")
    assert run.status == "failed"


def test_several_processes_in_one_replica_group_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = prudent.init(name="ft", exit_on_stop=False, settings=make_settings(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = tiny_model()
    with pytest.raises(ConfigError, match="rank 1 of 2 under torchrun.*--nproc-per-node 1"):
        replicate(run, model, torch.optim.SGD(model.parameters(), lr=0.1), replica_group=0,
                  lighthouse="http://localhost:1")
    run.context.finish("completed")


def test_a_joining_group_takes_every_attached_object_and_the_step_but_its_own_generator(
        tmp_path: Path) -> None:
    def attached(seed: int) -> RunContext:
        ctx = context(tmp_path)
        model = tiny_model(seed=seed)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        ctx.objects.update(model=model, optimizer=opt, data=torch.Generator().manual_seed(seed),
                           **{MANAGER_KEY: FakeManager()})
        return ctx

    peer, joining = attached(seed=1), attached(seed=2)
    peer.state.step, peer.state.epoch = 412, 3
    generator_state = joining.objects["data"].get_state()
    sent = HealState(peer).state_dict()
    assert set(sent["objects"]) == {"model", "optimizer"}
    healing = HealState(joining)
    healing.load_state_dict(sent)
    for mine, theirs in zip(joining.objects["model"].parameters(), peer.objects["model"].parameters()):
        assert torch.equal(mine, theirs)
    assert joining.objects["optimizer"].state_dict()["state"][0]["step"] == 1
    assert torch.equal(joining.objects["data"].get_state(), generator_state)
    assert (joining.state.step, joining.state.epoch) == (412, 3)
    assert healing.healed is not None and healing.healed[0] == 0


def recorder(ctx: RunContext, group: int = 0) -> tuple[MembershipRecorder, SimpleNamespace,
                                                       FakeManager, SimpleNamespace]:
    manager, quorum = FakeManager(), SimpleNamespace(quorum=None)
    optimizer = SimpleNamespace(committed=True)
    transport = SimpleNamespace(received=None)
    rec = MembershipRecorder(group, manager, quorum, optimizer, HealState(ctx),  # type: ignore[arg-type]
                             transport)  # type: ignore[arg-type]
    return rec, quorum, manager, SimpleNamespace(optimizer=optimizer, transport=transport)


def step(ctx: RunContext, rec: MembershipRecorder) -> None:
    ctx.state.step += 1
    rec.on_step_end(ctx, {})


def test_the_record_shows_who_left_and_joined_with_how_many_train_now(tmp_path: Path) -> None:
    events = RecordedEvents()
    ctx = context(tmp_path, events)
    rec, quorum, manager, _ = recorder(ctx, group=0)
    quorum.quorum, manager.participants = (1, (1, 0)), 2
    step(ctx, rec)
    step(ctx, rec)  # the same quorum: nothing to record
    quorum.quorum, manager.participants = (2, (0,)), 1
    step(ctx, rec)
    quorum.quorum, manager.participants = (3, (0, 2)), 2
    step(ctx, rec)
    recorded = [(r["kind"], r["name"], r["step"], r["message"]) for r in events.rows]
    assert recorded == [
        ("lifecycle", "membership", 1, "replica group 0 joined at step 1: 2 replica groups "
         "train now (0, 1), 2 participating"),
        ("lifecycle", "membership", 3, "replica group 1 left at step 3: 1 replica group trains "
         "now (0), 1 participating"),
        ("lifecycle", "membership", 4, "replica group 2 joined at step 4: 2 replica groups "
         "train now (0, 2), 2 participating")]
    assert json.loads(events.rows[1]["payload"]) == {
        "left": [1], "joined": [], "replica_groups": [0], "world_size": 1, "participants": 1,
        "quorum_id": 2, "replica_group": 0}


def test_a_run_of_dropped_updates_is_one_event_with_its_steps_and_cause(tmp_path: Path) -> None:
    events = RecordedEvents()
    ctx = context(tmp_path, events)
    rec, _, manager, parts = recorder(ctx)
    step(ctx, rec)
    parts.optimizer.committed = False
    manager.error = SimpleNamespace(original_exception=RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:39638. This is typically caused by a remote worker "
        "crashing.\ntraceback..."))
    step(ctx, rec)
    step(ctx, rec)
    parts.optimizer.committed = True
    step(ctx, rec)
    assert [(r["name"], r["step"], r["message"]) for r in events.rows] == [
        ("not_committed", 3, "steps 2 to 3 of replica group 0 not committed (2 updates "
         "dropped): Connection closed by peer [127.0.0.1]:39638")]
    parts.optimizer.committed = False
    step(ctx, rec)
    rec.on_end(ctx, "stopped", None)  # a run of drops still open at the end is recorded
    assert events.names()[-1] == "lifecycle/not_committed" and manager.shut_down is False


def test_a_heal_is_recorded_with_its_source_and_how_long_it_took(tmp_path: Path) -> None:
    events = RecordedEvents()
    ctx = context(tmp_path, events)
    rec, quorum, _, parts = recorder(ctx, group=1)
    quorum.quorum = (4, (0, 1))
    rec.heal.healed = (50, 0.002)
    parts.transport.received = (0, 0.015)
    ctx.state.step = 366
    step(ctx, rec)
    healed = next(r for r in events.rows if r["name"] == "healed")
    assert healed["message"] == ("replica group 1 took replica group 0's state at step 367 "
                                 "instead of a checkpoint (it was at step 50): received in 15 ms, "
                                 "loaded in 2 ms")
    rec.on_end(ctx, "completed", None)
    assert rec.manager.shut_down is True


def test_the_gradient_hook_survives_an_allreduce_that_failed() -> None:
    buffer = torch.ones(4)

    class FailedWork:
        def wait(self) -> bool:
            return False  # torchft's work: the error went to the manager

    manager = SimpleNamespace(allreduce=lambda tensor: FailedWork())
    future = FaultTolerantDDP._comm_hook(manager, SimpleNamespace(buffer=lambda: buffer))
    assert future.done() and future.value() is buffer


def test_the_optimizer_steps_only_a_committed_step_and_says_so() -> None:
    model = tiny_model()
    manager = FakeManager()
    opt = CommitOptimizer(manager, torch.optim.SGD(model.parameters(), lr=1.0))
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    manager.commit = False
    opt.step()
    assert not opt.committed and manager.quorums == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    manager.commit = True
    opt.step()
    assert opt.committed and not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_process_group_notes_each_quorums_replica_groups() -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pg = QuorumGloo(timeout=timedelta(seconds=5))
    pg.configure(f"localhost:{store.port}/torchft/5/0", "replica3", 0, 1, 5, 0, 1, [3])
    assert pg.quorum == (5, (3,))
    tensor = torch.ones(2)
    pg.allreduce([tensor], torch.distributed.AllreduceOptions()).wait()
    assert math.isclose(tensor.sum().item(), 2.0)
    pg.shutdown()
