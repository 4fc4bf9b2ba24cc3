"""Running under ``torchrun``: one writer, every rank restored, all ranks stopping together.

Rank 0 registers the run, writes metrics, events and checkpoint files; every rank takes part
in a checkpoint (its own generators and data position travel in it, see
``prudent.checkpoint.ranks``) and restores its own part. What must happen on every rank at
the same step (a stop, a periodic save) is agreed without a barrier in the step: a step's end
*posts* a small ``all_reduce`` (stop wanted? save wanted? how many steps until the next
one?) on prudent's own gloo group, and a later step's end reads it (the reduction ran
meanwhile, beside the user's compute). Every rank reads the same numbers at the same step,
so every rank acts at that step. Even posted and read a step later, a collective per step
cost a 2-rank gloo job on 2 cores about 0.6 ms a step (its threads compete with the
training's; ``benchmarks/ranks_agreement.py``), so the ranks agree about every
``run.ranks_agree_every_s`` of training instead (0.2 s; at the planned last step at the
latest): the interval in steps is itself agreed (the largest
any rank proposes from its step time), so every rank posts and reads at the same steps. A
stop or a timed save therefore waits up to two intervals; never a device sync, nor a wait
inside prudent for the slowest rank (a straggler still makes the others wait in the
gradient all-reduce).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from prudent.kernel.errors import ConfigError
from prudent.kernel.events import Component, EventKind
from prudent.kernel.stop import StopReason
from prudent.store.writer import NullWriter, event_signature

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["AgreementPoster", "RankGroup", "Ranks", "StopCoordinator", "give_gloo_workers_their_exit",
           "new_gloo_group", "ranks_from_env"]

MAX_AGREE_STEPS = 10_000
# how long the process gives gloo's worker threads at exit, GIL released (see _gloo_workers_done)
GLOO_EXIT_GRACE_S = 0.1
_NODE_MARKS = ".nodes"  # the checkpoint location's folder of each start's node marks


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    num_nodes: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def ranks_from_env(environ: Mapping[str, str] | None = None) -> Ranks:
    """The ranks torchrun (or SLURM via torchrun) sets in the environment; nodes are
    torchrun's agents (``GROUP_WORLD_SIZE``)."""
    env = os.environ if environ is None else environ
    return Ranks(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                 int(env.get("LOCAL_RANK", 0)), int(env.get("GROUP_WORLD_SIZE", 1)))


class RankGroup:
    """prudent's own gloo group over every rank of the job.

    Its collectives never share the training's process group (they would interleave with
    DDP's buckets or an asynchronous checkpoint's) nor its device (a CUDA tensor read back is
    a device sync). Created at its first use, which every rank reaches at the same point.
    """

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self._group: Any = None
        self._ready = False

    @property
    def ready(self) -> bool:
        """The script has initialised torch.distributed: collectives can run (asked every
        step: once true, remembered)."""
        if not self._ready:
            import torch.distributed as dist

            self._ready = dist.is_available() and dist.is_initialized()
        return self._ready

    @property
    def group(self) -> Any:
        if self._group is None:
            self._group = new_gloo_group()
        return self._group

    def post_flags(self, *flags: int) -> PendingFlags:
        """Start a MAX all-reduce of ``flags``; read it later with ``PendingFlags.result()``."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(flags, dtype=torch.int32)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return PendingFlags(work, tensor)

    def post_max(self, *values: float) -> PendingFlags:
        """Start a MAX all-reduce of every rank's ``values`` (floats); ``result()[i]`` is the
        largest ``values[i]``. For decisions every rank must take alike, such as skipping an
        update: posted before the backward pass, read after it, its latency hides behind the
        backward."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return PendingFlags(work, tensor)

    def from_main(self, value: bool) -> bool:
        """Rank 0's ``value`` on every rank (blocking: for rare moments such as an epoch end)."""
        return bool(self.post_flags(int(value) if self.ranks.is_main else 0).result()[0])

    def all_gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None on the other ranks."""
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * self.ranks.world_size if self.ranks.is_main else None
        dist.gather_object(obj, gathered, dst=0, group=self.group)
        return gathered


def new_gloo_group() -> Any:
    """A gloo group of prudent's own over every rank (beside the training's), whose worker
    threads get their grace at exit (:func:`give_gloo_workers_their_exit`)."""
    import torch.distributed as dist

    group = dist.new_group(backend="gloo")
    give_gloo_workers_their_exit()
    return group


@functools.cache
def give_gloo_workers_their_exit() -> None:
    """Register :func:`_gloo_workers_done` at exit, once per process: for each gloo group
    prudent makes (its own, the one asynchronous sharded checkpoints write with, torchft's)."""
    atexit.register(_gloo_workers_done)


def _gloo_workers_done() -> None:
    """Before the interpreter finalizes, let gloo's worker threads drop their last collective.

    A gloo worker releases a finished collective's tensors after the caller's ``wait()``
    returned, and releasing a tensor made in Python takes the GIL. If the process is
    finalizing by then, the thread exits inside a C++ destructor and the process aborts
    ("terminate called without an active exception", SIGABRT): torchrun reports a run that
    completed as failed. Under load about 1 job in 14 of 2 gloo ranks on 2 cores did so, with
    or without prudent, after its script's last ``all_gather``; prudent's own gloo group runs
    beside NCCL jobs too. The worker needs the GIL only for microseconds once scheduled:
    sleeping (GIL released) at exit gives it that, after the script's last collective.
    """
    time.sleep(GLOO_EXIT_GRACE_S)


class PendingFlags:
    """An all-reduce in flight: ``result()`` waits for it (done long ago, as a rule)."""

    def __init__(self, work: Any, tensor: Any) -> None:
        self._work, self._tensor = work, tensor

    def result(self) -> list[Any]:
        self._work.wait()
        return self._tensor.tolist()


# what a rank other than 0 alone can know: its rules' findings, its failure bundles, its
# profile's findings; not its lifecycle, checkpoints or costs (rank 0 records the run's)
_RELAYED_KINDS = frozenset({EventKind.RULE.value, EventKind.MONITOR.value, EventKind.CAPTURE.value,
                            EventKind.CAPTURE_REQUESTED.value, EventKind.FINDING.value})


def _relayed(row: dict[str, Any]) -> bool:
    """An event of another rank that rank 0 records for it: not one of an action the ranks
    agreed on (a skipped update: every rank records it, rank 0 for the run)."""
    return row["kind"] in _RELAYED_KINDS and not json.loads(row.get("payload") or "{}").get(
        "ranks_agreed")


def _holds_events(run: RunContext) -> bool:
    """This rank (not 0) has events for rank 0's record (see StopCoordinator._relay_events)."""
    writer = run.writer
    return isinstance(writer, NullWriter) and writer.holds_events


def unreplicated_models(objects: dict[str, Any]) -> list[str]:
    """The attached models with trainable parameters that no data-parallel wrapper holds:
    neither DDP (torch's, or one of its subclasses), FSDP, nor FSDP2's DTensor shards, even
    under ``torch.compile``. The README's five lines run under torchrun as they are, and such
    a model silently trains one copy per rank."""
    import torch

    from prudent.checkpoint.sharded import holds_shards

    found = []
    for key, obj in objects.items():
        if not isinstance(obj, torch.nn.Module):
            continue
        module = getattr(obj, "_orig_mod", obj)  # torch.compile's wrapper
        wrapped = isinstance(module, torch.nn.parallel.DistributedDataParallel) or \
            type(module).__name__ in _DATA_PARALLEL or holds_shards(module)
        if not wrapped and any(p.requires_grad for p in module.parameters()):
            found.append(key)
    return found


_DATA_PARALLEL = {"FullyShardedDataParallel", "DistributedDataParallel"}  # FSDP1, torchft's DDP


class StopCoordinator(Component):
    """Turns one rank's stop request (or rank 0's wish to checkpoint) into every rank's, at
    the same step.

    The first ``on_step_end`` handler: at the agreed step it reads the flags the ranks posted
    an interval before (``AgreementPoster``, the last handler, posts them), so every component
    of this step sees the agreed stop (``run.pending_stop``) and the agreed save
    (``run.save_agreed``); other steps cost it one comparison.
    The run holds its own stop requests back (``run.defer_stops``) until then. At the first
    ``attach`` (or step) the ranks check they resumed from the same checkpoint step.
    """

    name = "distributed"

    def __init__(self, ranks: Ranks, agree_every_s: float = 0.2) -> None:
        self.ranks = ranks
        self.agree_every_s = agree_every_s
        self.group = RankGroup(ranks)
        self.poster = AgreementPoster(self)
        self.pending: PendingFlags | None = None
        self.read_at = 0  # the step whose end reads ``pending``
        self.interval = 1  # steps between agreements, as last agreed
        self._posted_at: tuple[int, float] | None = None  # step and time of the last post
        self._warned = False
        self._checked_start = False
        # rank 0: other ranks' events (the agreement they came at, rank, " (on HOST)" if not
        # rank 0's, row) to record, and those recorded (see _relay_events)
        self._reads = 0
        self._relayed: list[tuple[int, int, str, dict[str, Any]]] = []
        self._relayed_seen: set[tuple[Any, ...]] = set()

    def on_start(self, run: RunContext) -> None:
        run.defer_stops = True
        run.rank_group = self.group

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        if not self._checked_start and self.group.ready:
            self._check_same_start(run)
        if self.ranks.is_main:
            for key in unreplicated_models(objects):
                message = (f"{key} is attached under torchrun ({self.ranks.world_size} ranks) "
                           "but neither wrapped in DistributedDataParallel nor sharded with "
                           "fully_shard: each rank trains a model of its own, and no gradient is "
                           f"averaged. Wrap it before attaching ({key} = "
                           f"DistributedDataParallel({key})), or ignore this for models trained "
                           "apart on purpose")
                print(f"prudent: warning: {message}", file=sys.stderr, flush=True)
                run.record_event(EventKind.LIFECYCLE, "unreplicated_model", message, key=key)

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        run.save_agreed = run.ranks_agreed = False
        if not self.group.ready:
            self._not_initialized(run)
            return
        if not self._checked_start:
            self._check_same_start(run)
        pending = self.pending
        if pending is None or run.state.step < self.read_at:
            return
        self.pending = None
        run.ranks_agreed = True  # later handlers of this step may run a collective
        stop, save, interval, events = pending.result()
        self.interval = interval
        run.save_agreed = bool(save)
        self._reads += 1
        if events:
            self._relay_events(run)
        if self._relayed:
            self._record_relayed(run)
        if stop:
            self._agree_on_stop(run)

    def post(self, run: RunContext) -> None:
        """Post this rank's flags and its proposed interval, to be read ``interval`` steps
        from now (the interval every rank read last time: the same step on every rank)."""
        step, now = run.state.step, time.perf_counter()
        proposed = 1
        if self._posted_at is not None and step > self._posted_at[0]:
            step_s = (now - self._posted_at[1]) / (step - self._posted_at[0])
            proposed = max(1, min(MAX_AGREE_STEPS, int(self.agree_every_s / max(step_s, 1e-9))))
        self._posted_at = (step, now)
        self.pending = self.group.post_flags(run.pending_stop is not None, run.save_proposed,
                                             proposed, _holds_events(run))
        self.read_at = step + self.interval
        planned = run.state.planned_steps
        if planned and step < planned:  # a stop asked near the end is not lost to the end
            self.read_at = min(self.read_at, planned)
        run.save_proposed = False

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        run.defer_stops = False
        pending, self.pending = self.pending, None
        # every rank posted it, so it completes, and every rank reads it: the last events come
        if pending is not None and status == "completed" and pending.result()[3]:
            self._relay_events(run)
        if self._relayed:
            self._record_relayed(run, everything=True)

    def _relay_events(self, run: RunContext) -> None:
        """Gather the events the other ranks recorded since the last relay; rank 0 records
        them one agreement later (see :meth:`_record_relayed`)."""
        from prudent.launch.spec import host_name

        writer = run.writer
        held = [row for row in writer.take_events() if _relayed(row)] \
            if isinstance(writer, NullWriter) else []
        gathered = self.group.all_gather((host_name(), held))
        if self.ranks.is_main:
            here = host_name()
            self._relayed += [(self._reads, rank, "" if host == here else f" (on {host})", row)
                              for rank, (host, events) in enumerate(gathered)
                              if rank != self.ranks.rank for row in events]

    def _record_relayed(self, run: RunContext, everything: bool = False) -> None:
        """Rank 0: the other ranks' events, relayed at an earlier agreement (``everything``:
        at the end, all), into the run's record, which rank said so in the message and the
        payload; but for copies of rank 0's own events (a notice every rank gives, a rule's
        verdict on the averaged gradients: rank 0 has had an agreement's time to give its own)
        and of one already recorded for another rank."""
        writer = run.writer
        due, self._relayed = self._relayed, []
        if not everything:  # those of this very agreement wait for the next
            self._relayed = [r for r in due if r[0] == self._reads]
            due = [r for r in due if r[0] < self._reads]
        if not due:
            return
        own = set(getattr(writer, "recent_events", ()))
        for _, rank, on_host, row in due:
            signature = event_signature(row)
            if signature in own or signature in self._relayed_seen:
                continue
            self._relayed_seen.add(signature)
            payload = json.loads(row.get("payload") or "{}")
            writer.put_event({**row, "message": f"rank {rank}{on_host}: {row['message']}",
                              "payload": json.dumps({**payload, "rank": rank})})

    def _agree_on_stop(self, run: RunContext) -> None:
        requests = self.group.all_gather(run.pending_stop)
        reason = next(r for r in requests if r is not None)
        origin = requests.index(reason)
        if origin != self.ranks.rank:
            reason = replace(reason, message=
                                f"{reason.message} (requested on rank {origin})")
        run.replace_stop(reason)
        run.defer_stops = False

    def _check_same_start(self, run: RunContext) -> None:
        """Every node sees the checkpoint location, and every rank resumed from the same
        checkpoint step (a node that could not see the checkpoints starts from scratch while
        the others resume: DDP would then average the gradients of two different models)."""
        self._checked_start = True
        checkpoints = run.checkpoints
        if self.ranks.num_nodes > 1 and checkpoints is not None:
            self._check_shared_location(run, checkpoints.storage)
        from prudent.distributed.elastic import record_membership
        from prudent.launch.spec import host_name

        mine = (run.state.step, getattr(checkpoints, "resumed_from", None), host_name())
        gathered = self.group.all_gather(mine)
        starts = [(step, name) for step, name, _ in gathered]
        if len(set(starts)) == 1:
            if self.ranks.is_main:
                record_membership(run, getattr(checkpoints, "resumed_hosts", None),
                                  [host for _, _, host in gathered])
            return
        listed = ", ".join(f"rank {r}: step {s} ({name or 'no checkpoint'})"
                           for r, (s, name) in enumerate(starts))
        run.refuse(ConfigError(
            f"the ranks did not resume from the same checkpoint ({listed}): every node must "
            "see the same checkpoint location. Point checkpoint.url (PRUDENT_CHECKPOINT_URL) "
            "at storage every node shares (a shared file system, s3://...), or remove the "
            "stray checkpoints"))

    def _check_shared_location(self, run: RunContext, storage: Any) -> None:
        """Each node's first rank leaves a mark in the checkpoint location and looks for the
        others' (rank 0's token tells this start's marks from older ones): a folder local to
        each node fails, and nothing trains on a location a resume would not find."""
        import secrets

        token = self.group.all_gather(secrets.token_hex(6) if self.ranks.is_main else None)[0]
        node = int(os.environ.get("GROUP_RANK", 0))
        leader = self.ranks.local_rank == 0
        if leader:
            storage.put(_NODE_MARKS, f"{token}-node{node}", b"")
        self.group.all_gather(None)  # every node has left its mark
        seen = sum(f.startswith(token) for f in storage.files(_NODE_MARKS)) if leader else None
        views = self.group.all_gather((node, seen))
        if self.ranks.is_main:
            for other in range(self.ranks.num_nodes):
                storage.delete_file(_NODE_MARKS, f"{token}-node{other}")
        blind = sorted({n for n, count in views if count is not None and count < self.ranks.num_nodes})
        if blind:
            run.refuse(ConfigError(
                f"the checkpoint location {storage.url!r} is not shared by the job's "
                f"{self.ranks.num_nodes} nodes (node {', '.join(map(str, blind))} cannot see the "
                "others' files in it): a resume would find no checkpoint, or another one, on "
                "some nodes. Point checkpoint.url (PRUDENT_CHECKPOINT_URL) at storage every "
                "node shares (a shared file system, s3://...)"))

    def _not_initialized(self, run: RunContext) -> None:
        run.defer_stops = False  # nothing to agree with: behave as a single process
        if not self._warned:
            self._warned = True
            warnings.warn("prudent runs under torchrun but torch.distributed is not initialised "
                          "when training starts: ranks cannot stop together. Call "
                          "dist.init_process_group() before the training loop", stacklevel=2)


class AgreementPoster(Component):
    """The last ``on_step_end`` handler: once the last agreement was read, posts this rank's
    flags (a stop requested, a save rank 0's checkpointer wants) for a later step to read."""

    name = "distributed_post"

    def __init__(self, coordinator: StopCoordinator) -> None:
        self.coordinator = coordinator

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        coordinator = self.coordinator
        if coordinator.pending is not None or not run.defer_stops:
            return  # in flight; or single-process behaviour, or a stop agreed: nothing follows
        if coordinator.group.ready:
            coordinator.post(run)
