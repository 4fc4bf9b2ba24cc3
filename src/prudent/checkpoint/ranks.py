"""Per-rank state in a checkpoint: each rank's generators and epoch position, and the world
the checkpoint was taken in.

A per-rank value saved once under one key comes back as rank 0's on every rank: after a
resume, ranks seeded ``1337 + rank`` all drew rank 0's batches (the scale-out issue measured
95 of 95 equal losses; DCP, Megatron and NeMo users hit the same). So each rank's part is
gathered on rank 0 when a checkpoint is taken and stored under its rank; each rank takes its
own part back. A rank the checkpoint did not have (a bigger world) keeps the streams the
script seeded and is told so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prudent.errors import ConfigError
from prudent.events import EventKind

if TYPE_CHECKING:
    from prudent.context import RunContext
    from prudent.distributed import Ranks

__all__ = ["check_world_change", "rank_state", "restore_rank_state", "world_of"]


def rank_state(run: RunContext) -> dict[str, Any]:
    """What this rank alone knows: its generators, its epoch's shuffle states, its host."""
    from prudent.launch import host_name
    from prudent.rng import capture_rng

    state = run.state
    return {"rng": capture_rng(), "epoch_rng": state.epoch_rng, "loader_rng": state.loader_rng,
            "host": host_name()}


def world_of(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The world a checkpoint was taken in: ranks, nodes, each rank's host."""
    hosts = [part["host"] for part in parts]
    return {"world_size": len(parts), "num_nodes": len(set(hosts)), "hosts": hosts}


def restore_rank_state(run: RunContext, saved_run: dict[str, Any], ranks: Ranks) -> None:
    """Put this rank's own generators and epoch states in place of rank 0's (which
    ``RunContext.load_state_dict`` restored for every rank)."""
    parts = saved_run.get("ranks")
    if not parts:
        return  # a single process's checkpoint, or one from before per-rank state
    if ranks.rank < len(parts) and parts[ranks.rank] is not None:
        mine = parts[ranks.rank]
        run.resume_rng = mine["rng"]
        run.state.epoch_rng, run.state.loader_rng = mine["epoch_rng"], mine["loader_rng"]
        return
    run.resume_rng = {}  # restores nothing: the streams the script seeded go on
    run.record_event(EventKind.CHECKPOINT, "rank_fresh", f"rank {ranks.rank} is not in the "
                     f"checkpoint (taken on {len(parts)} ranks): it keeps the random streams "
                     "the script seeded", rank=ranks.rank)


def check_world_change(run: RunContext, saved_world: int | None, world_size: int) -> None:
    """A checkpoint taken mid-epoch on another number of ranks: the batches already trained
    are counted over the whole world (``batches x ranks``), and each rank of the new world
    skips its share of them. When the new world cannot split them evenly, nothing starts:
    replaying or skipping samples is silently wrong, and the next epoch's checkpoint (or a
    world size that divides them) resumes exactly."""
    state = run.state
    if saved_world is None or saved_world == world_size:
        return
    done = state.batches_in_epoch * saved_world
    message = (f"checkpoint taken on {saved_world} ranks, resumed on {world_size}")
    if done and done % world_size:
        divisors = [n for n in range(2, 4 * world_size + 1) if done % n == 0]
        raise ConfigError(
            f"{message}, {state.batches_in_epoch} batches per rank into epoch {state.epoch + 1}: "
            f"the {done} batches already trained of that epoch cannot be split evenly over "
            f"{world_size} ranks. Resume on a number of ranks that divides {done} "
            f"({', '.join(map(str, divisors))}), or from a checkpoint taken at an epoch's end")
    where = (f"; {done} batches of epoch {state.epoch + 1} already trained, "
             f"{done // world_size} per rank from now on") if done else ""
    run.record_event(EventKind.CHECKPOINT, "world_changed", message + where,
                     saved_world_size=saved_world, world_size=world_size, batches_done=done)
    state.batches_in_epoch = done // world_size
