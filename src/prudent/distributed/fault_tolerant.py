"""Replica groups that die and rejoin while the others train on (torchft, ``prudent[ft]``).

Data parallelism across *replica groups* (a group: one machine; here one process) that
torchft's Lighthouse gathers into a quorum at every step. A group that dies is dropped at the
next step and the survivors go on without a restart or a reload; a group that starts (again)
takes the weights, the optimizer and every other attached object, and the step, from a live
peer instead of a checkpoint. prudent's checkpoints are then for whole-job failures::

    run = prudent.init(name="digits-ft", config=cfg, model=model, optimizer=opt)
    group = replicate(run, model, opt)      # TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID
    with run:
        for _ in run.steps(cfg["steps"]):
            group.optimizer.zero_grad()     # this step's quorum; a group that joins heals here
            x, y = batch(run.state.step, group.replica_group)  # the data follows the step
            loss = F.cross_entropy(group.model(x), y)
            run.backward(loss)              # gradients averaged over the live groups
            group.optimizer.step()          # only if the live groups committed the step
            run.step(loss=loss)

The record shows a ``membership`` event when the quorum's groups change (who left, who
joined, how many train now: what a bill counts; how many take part), as an elastic restart
does; ``healed`` when this group took a peer's state (how long that took) and
``not_committed`` for steps whose update was dropped (a peer died mid-step: the steps lost).

Each replica group is its own prudent run, with its own record and checkpoints: a group is
its own world (its own rank 0), and several writers of one run would fight over one record
and one checkpoint folder. A shared checkpoint URL must therefore hold ``{run_id}``, and
each group needs a run id of its own that a restart keeps (``PRUDENT_RUN_ID=job-replica1``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed import TCPStore

from prudent.checkpoint.objects import restore_object, state_of
from prudent.distributed.torchrun import give_gloo_workers_their_exit, ranks_from_env
from prudent.kernel.errors import ConfigError
from prudent.kernel.events import Component, EventKind

try:
    import torchft
    from torchft.checkpointing import HTTPTransport
except ImportError:  # pragma: no cover - the message is the point
    raise ImportError("prudent.fault_tolerant needs torchft: pip install 'prudent[ft]'") from None

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.run import Run
    from prudent.kernel.stop import StopReason

__all__ = ["ENV_LIGHTHOUSE", "ENV_REPLICA_GROUP", "MANAGER_KEY", "MembershipRecorder",
           "ReplicaGroup", "replicate"]

ENV_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # torchft's own variable: http://host:29510
ENV_REPLICA_GROUP = "REPLICA_GROUP_ID"  # torchft's examples' convention: 0, 1, ...
MANAGER_KEY = "torchft"  # the Manager's step and batches_committed, in prudent's checkpoints


@dataclass
class ReplicaGroup:
    """What :func:`replicate` hands the loop: the wrapped model and optimizer to train with,
    torchft's Manager (``manager.current_step()``: committed steps) and this group's id."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    manager: Any
    replica_group: int


def replicate(run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
              replica_group: int | None = None, lighthouse: str | None = None,
              min_replicas: int = 1, timeout_s: float = 30.0) -> ReplicaGroup:
    """Join this run's process to the job's replica groups; call it once the model and
    optimizer are attached (restored, when the run resumes) and just before the loop: a
    group whose Manager exists but does not ask for quorums yet holds the others up.

    ``replica_group`` defaults to ``$REPLICA_GROUP_ID``, ``lighthouse`` to
    ``$TORCHFT_LIGHTHOUSE``; a step commits only while ``min_replicas`` groups take part;
    ``timeout_s`` bounds a collective, a commit and a peer's state transfer.
    """
    ctx = run.context
    group, address = _replica_group(replica_group), _lighthouse(lighthouse)
    _check_one_process()
    _check_own_location(ctx, group)
    timeout = timedelta(seconds=timeout_s)
    pg, transport, heal = QuorumGloo(timeout=timeout), TimedTransport(timeout), HealState(ctx)
    give_gloo_workers_their_exit()  # torchft's gloo group too (see prudent.distributed.torchrun)
    # the group's own store (torchft's Manager meets its ranks there; here: one rank)
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = torchft.Manager(
        pg=pg, load_state_dict=heal.load_state_dict, state_dict=heal.state_dict,
        min_replica_size=min_replicas, replica_id=f"replica{group}", rank=0, world_size=1,
        store_addr="localhost", store_port=store.port, lighthouse_addr=address,
        timeout=timeout, checkpoint_transport=transport,
        # the quorum (and a heal) done in zero_grad, before the forward pass: a group that
        # heals computes its first loss with the peer's weights and takes part in that step
        # (asynchronous, the forward overlaps the quorum and the first loss logged is the old
        # model's; 2 groups on 2 CPU cores measured 5.2 ms a step this way, 5.3 ms the other)
        use_async_quorum=False)
    run.attach(**{MANAGER_KEY: manager})  # restores its step when the run resumes
    optimizer = CommitOptimizer(manager, optimizer)
    ctx.add_component(MembershipRecorder(group, manager, pg, optimizer, heal, transport, store))
    return ReplicaGroup(FaultTolerantDDP(manager, model), optimizer, manager, group)


def _replica_group(value: int | None) -> int:
    text = str(value) if value is not None else os.environ.get(ENV_REPLICA_GROUP, "")
    if not text.isdigit():
        raise ConfigError(
            f"replica group must be a number >= 0, got {text or 'nothing'!r}: pass "
            f"replicate(..., replica_group=N) or set {ENV_REPLICA_GROUP}=N, one N per group")
    return int(text)


def _lighthouse(value: str | None) -> str:
    address = value or os.environ.get(ENV_LIGHTHOUSE)
    if not address:
        raise ConfigError(
            f"no torchft lighthouse: set {ENV_LIGHTHOUSE}=http://HOST:29510 (start one with "
            "`torchft_lighthouse --min_replicas 1`) or pass replicate(..., lighthouse=...)")
    return address


def _check_one_process() -> None:
    ranks = ranks_from_env()
    if ranks.is_distributed:
        raise ConfigError(
            f"replicate() trains one process per replica group, but this is rank {ranks.rank} "
            f"of {ranks.world_size} under torchrun: its ranks would not average their gradients "
            "with each other. Start each replica group with --nproc-per-node 1")


def _check_own_location(ctx: RunContext, group: int) -> None:
    """Every group writes its own checkpoints: a shared URL must name the run."""
    settings = getattr(ctx.settings, "checkpoint", None)
    url = getattr(settings, "url", None)
    if settings is not None and settings.enabled and url and "{run_id}" not in url:
        ctx.refuse(ConfigError(
            f"checkpoint.url {url!r} would be written by every replica group (replica group "
            f"{group} is one): put {{run_id}} in it (PRUDENT_CHECKPOINT_URL='{url}/{{run_id}}') "
            f"and give each group its own run id (PRUDENT_RUN_ID=<job>-replica{group})"))


class HealState:
    """What a group that joins receives from a live peer, in place of a checkpoint: every
    attached object (model, optimizer, scheduler, ...) but the Manager, whose state torchft
    sends itself, and generators, which draw this group's own data; and the run's step and
    epoch, so the loop and the record go on at the job's step."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.healed: tuple[int, float] | None = None  # (step before, seconds to load)

    def state_dict(self) -> dict[str, Any]:
        """Called on the quorum thread of a peer that sends its state (its training thread
        waits in ``zero_grad`` meanwhile: the quorum is synchronous)."""
        objects = {key: state_of(obj) for key, obj in list(self.ctx.objects.items())
                   if _travels(key, obj)}
        return {"objects": objects, "step": self.ctx.state.step, "epoch": self.ctx.state.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called on the training thread, in the ``zero_grad`` whose quorum heals."""
        started = time.perf_counter()
        for key, saved in state["objects"].items():
            if key in self.ctx.objects:
                restore_object(self.ctx.objects[key], saved)
        before = self.ctx.state.step
        self.ctx.state.step, self.ctx.state.epoch = state["step"], state["epoch"]
        self.healed = (before, time.perf_counter() - started)


def _travels(key: str, obj: Any) -> bool:
    return key != MANAGER_KEY and not isinstance(obj, torch.Generator)


class QuorumGloo(torchft.ProcessGroupGloo):
    """torchft's reconfigurable gloo group, noting each quorum it is configured for: its id
    and the replica groups in it (torchft numbers a replica by its id's trailing digits)."""

    quorum: tuple[int, tuple[int, ...]] | None = None  # (quorum id, members in quorum order)

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  quorum_id: int | None = None, group_rank: int | None = None,
                  group_world_size: int | None = None,
                  global_ranks: list[int] | None = None) -> None:
        super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank,
                          group_world_size, global_ranks)
        members = tuple(r // (group_world_size or 1) for r in global_ranks or ())
        self.quorum = (-1 if quorum_id is None else quorum_id, members)


class TimedTransport(HTTPTransport):
    """torchft's HTTP transfer of a peer's state, timed: the heal's share that is network."""

    def __init__(self, timeout: timedelta) -> None:
        super().__init__(timeout=timeout, num_chunks=0)
        self.received: tuple[int, float] | None = None  # (source replica rank, seconds)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int,
                        timeout: timedelta) -> Any:
        started = time.perf_counter()
        state = super().recv_checkpoint(src_rank, metadata, step, timeout)
        self.received = (src_rank, time.perf_counter() - started)
        return state


class FaultTolerantDDP(torchft.DistributedDataParallel):
    """torchft's DDP, whose gradient hook survives a peer that dies mid-allreduce.

    torchft 0.2.0's hook asserts on a future that a failed gloo allreduce never sets
    (``AssertionError`` in ``ddp.py _comm_hook`` on the survivor, torch 2.13): this one lets
    the Manager keep the error, so the step is not committed and the next quorum drops the
    dead group. On success the bucket already holds the average (torchft divides in place).
    """

    @staticmethod
    def _comm_hook(manager, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
        buffer = bucket.buffer()
        manager.allreduce(buffer).wait()  # False on an error, which the Manager keeps
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(buffer)
        return done


class CommitOptimizer(torchft.Optimizer):
    """torchft's optimizer wrapper, remembering whether the last step was committed."""

    committed = True

    def step(self, closure: object = None) -> None:
        if closure is not None:
            raise ValueError("torchft's optimizer takes no closure")
        self.committed = self.manager.should_commit()
        if self.committed:
            self.optim.step()


class MembershipRecorder(Component):
    """Records the quorum's changes, heals and dropped steps; shuts the Manager down at the
    end. Its step-end handler compares a few fields (the quorum is torchft's, read as its
    thread left it), so it costs well under a microsecond on a step where nothing changed."""

    name = "replica_groups"

    def __init__(self, group: int, manager: Any, pg: QuorumGloo, optimizer: CommitOptimizer,
                 heal: HealState, transport: TimedTransport, store: Any = None) -> None:
        self.group, self.manager, self.pg, self.optimizer = group, manager, pg, optimizer
        self.heal, self.transport = heal, transport
        self._store = store  # the group's TCPStore: lives as long as the Manager
        self._quorum: tuple[int, tuple[int, ...]] | None = None
        self._members: tuple[int, ...] = ()
        self._dropped: list[Any] = []  # [first step, last step, error] of a run of drops

    def on_step_end(self, ctx: RunContext, metrics: dict[str, Any]) -> None:
        if self.pg.quorum is not self._quorum:
            self._quorum_changed(ctx, self.pg.quorum)
        if self.heal.healed is not None:
            self._healed(ctx)
        if not self.optimizer.committed:
            self._not_committed(ctx)
        elif self._dropped:
            self._record_dropped(ctx)

    def on_end(self, ctx: RunContext, status: str, reason: StopReason | None) -> None:
        if self._dropped:
            self._record_dropped(ctx)
        # a completed loop has no quorum in flight; a stop may have one: do not wait for it
        self.manager.shutdown(wait=status == "completed")

    def _quorum_changed(self, ctx: RunContext, quorum: tuple[int, tuple[int, ...]] | None
                        ) -> None:
        """The job's ``membership`` event (the one an elastic restart records too): who
        left, who joined, how many train now (what a bill counts) and take part (whose
        gradients count)."""
        self._quorum = quorum
        before, members = self._members, tuple(sorted(set(quorum[1]))) if quorum else ()
        self._members = members
        left = sorted(set(before) - set(members))
        # this group's first quorum: it joined (the others were there before it)
        joined = sorted(set(members) - set(before)) if before else [self.group]
        said = ", ".join(f"{_groups(g)} {verb}" for g, verb in ((left, "left"),
                                                               (joined, "joined")) if g)
        participants = self.manager.num_participants()
        ctx.record_event(
            EventKind.LIFECYCLE, "membership", f"{said} at step {ctx.state.step}: "
            f"{_count(len(members))} train{'s' if len(members) == 1 else ''} now "
            f"({', '.join(map(str, members))}), {participants} participating",
            left=left, joined=joined, replica_groups=list(members), world_size=len(members),
            participants=participants, quorum_id=quorum[0] if quorum else None,
            replica_group=self.group)

    def _healed(self, ctx: RunContext) -> None:
        before, load_s = self.heal.healed  # type: ignore[misc]
        self.heal.healed = None
        src_rank, receive_s = self.transport.received or (None, 0.0)
        members = self._quorum[1] if self._quorum else ()
        source = members[src_rank] if src_rank is not None and src_rank < len(members) else None
        ctx.record_event(
            EventKind.LIFECYCLE, "healed", f"replica group {self.group} took replica group "
            f"{source}'s state at step {ctx.state.step} instead of a checkpoint (it was at step "
            f"{before}): received in {receive_s * 1000:.0f} ms, loaded in {load_s * 1000:.0f} ms",
            source=source, from_step=before, receive_s=receive_s, load_s=load_s,
            heal_s=receive_s + load_s, replica_group=self.group)

    def _not_committed(self, ctx: RunContext) -> None:
        if self._dropped:
            self._dropped[1] = ctx.state.step
            return
        error = self.manager.errored()
        cause = getattr(error, "original_exception", error)
        self._dropped = [ctx.state.step, ctx.state.step, _first_sentence(cause)
                         if cause is not None else "fewer replica groups than min_replicas"]

    def _record_dropped(self, ctx: RunContext) -> None:
        first, last, cause = self._dropped
        self._dropped = []
        count = last - first + 1
        ctx.record_event(
            EventKind.LIFECYCLE, "not_committed", f"step{'s' if count > 1 else ''} {first}"
            f"{f' to {last}' if count > 1 else ''} of replica group {self.group} not committed "
            f"({count} update{'s' if count > 1 else ''} dropped): {cause}", step=last,
            first_step=first, last_step=last, num_steps=count, error=cause,
            replica_group=self.group)


def _first_sentence(error: BaseException) -> str:
    """``Connection closed by peer [127.0.0.1]:39638`` of gloo's ``[/__w/.../pair.cc:553]
    Connection closed by peer [127.0.0.1]:39638. This is typically caused by ...``."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(error).splitlines()[0] if str(error) else "")
    return text.split(". ")[0] or type(error).__name__


def _groups(groups: list[int]) -> str:
    listed = ", ".join(map(str, groups))
    return f"replica group {listed}" if len(groups) == 1 else f"replica groups {listed}"


def _count(number: int) -> str:
    return f"{number} replica group{'' if number == 1 else 's'}"
