"""Elastic jobs (``torchrun --nnodes MIN:MAX``): a lost machine does not end the job.

When a machine dies, the collectives of the ranks that are left fail (gloo: "Connection reset
by peer"; NCCL: a remote error or a timeout). That is not the script's bug: the run records
it as a lost rank and exits 75 (resume me), without a failure bundle, and torchrun restarts
the survivors, who re-form the group with the machines that are left and resume from the
newest checkpoint, resharded to the new world (``prudent.checkpoint``). When the machine
comes back, torchrun stops the workers (a stop saved at that step) and restarts them in the
bigger world. Each world's first start records who left and who joined, the world size and
the step (a ``membership`` event); the cost meter bills each attempt for the machines it ran
on (``prudent.cost.shape``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from prudent.kernel.events import EventKind

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["announce_crash", "crashed_peer", "peer_lost", "record_membership"]

_STORE_WAIT_S = 5.0  # a store whose host is gone with its machine must not hang the exit

# what a collective raises when another rank's process or machine is gone (in an error of
# the collectives' own: a user's socket error is the user's)
_LOST_PEER_SIGNS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
                    "remote process exited", "communicator was aborted", "Socket Timeout")
_COLLECTIVES = ("gloo", "nccl", "c10d", "ProcessGroup")


def peer_lost(exc: BaseException) -> str | None:
    """The first line of ``exc`` when it says another rank of the job is gone, else None."""
    try:
        import torch.distributed as dist

        network_errors: tuple[type[BaseException], ...] = (dist.DistNetworkError,)
    except (ImportError, AttributeError):
        network_errors = ()
    text = str(exc)
    ours = any(c.lower() in text.lower() for c in _COLLECTIVES)
    if not isinstance(exc, network_errors) and not (
            ours and any(s in text for s in _LOST_PEER_SIGNS)):
        return None
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__


def announce_crash(rank: int, message: str) -> None:
    """This rank's script raised: a note in torch.distributed's key-value store (torchrun's,
    which outlives the workers), so that the ranks left do not take its loss for a vanished
    machine (exit 75, resumed without end) but for the crash it is (exit 1)."""
    store = _default_store()
    if store is not None:
        try:
            store.set(_crash_key(rank), message[:500])
        except Exception:  # noqa: BLE001 - the crash itself is what this rank reports
            pass


def crashed_peer(world_size: int, me: int) -> str | None:
    """``"rank N: <its error>"`` when another rank of this launch announced a crash."""
    store = _default_store()
    if store is None:
        return None
    try:
        for rank in range(world_size):
            if rank != me and store.check([_crash_key(rank)]):
                return f"rank {rank}: {store.get(_crash_key(rank)).decode(errors='replace')}"
    except Exception:  # noqa: BLE001 - the store went with the machine: a lost rank, then
        return None
    return None


def _crash_key(rank: int) -> str:
    # torchrun restarts its workers with the same store: a note per restart
    return f"prudent/crashed/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"


def _default_store() -> Any:
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store

        if not dist.is_initialized():
            return None
        store = _get_default_store()
        store.set_timeout(timedelta(seconds=_STORE_WAIT_S))
        return store
    except Exception:  # noqa: BLE001 - no store (another init method, an old torch)
        return None


def record_membership(run: RunContext, saved_hosts: list[str] | None, hosts: list[str]) -> None:
    """On rank 0 at a resumed start: the machines that left and joined since the checkpoint
    (a world of another size, or other machines), as one event."""
    if saved_hosts is None or (len(saved_hosts) == len(hosts) and saved_hosts == hosts):
        return
    before, now = set(saved_hosts), set(hosts)
    left, joined = sorted(before - now), sorted(now - before)
    parts = [f"{', '.join(left)} left" if left else "", f"{', '.join(joined)} joined" if joined else ""]
    said = "; ".join(p for p in parts if p) or "the same machines"
    run.record_event(EventKind.LIFECYCLE, "membership",
                     f"{_count(len(saved_hosts), 'rank')} on {_count(len(before), 'machine')} -> "
                     f"{_count(len(hosts), 'rank')} on {_count(len(now), 'machine')} at step "
                     f"{run.state.step}: {said}",
                     left=left, joined=joined, world_size=len(hosts),
                     saved_world_size=len(saved_hosts), hosts=hosts)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
