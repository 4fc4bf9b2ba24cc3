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

from prudent.kernel.events import EventKind

if TYPE_CHECKING:
    from prudent.distributed.torchrun import Ranks
    from prudent.kernel.context import RunContext

__all__ = ["check_world_change", "rank_state", "restore_rank_state", "world_of"]


def rank_state(run: RunContext, rng: dict[str, Any] | None = None) -> dict[str, Any]:
    """What this rank alone knows: its generators (``rng`` when just captured), its epoch's
    shuffle states, its host."""
    from prudent.kernel.rng import capture_rng
    from prudent.launch.spec import host_name

    state = run.state
    return {"rng": rng if rng is not None else capture_rng(), "epoch_rng": state.epoch_rng,
            "loader_rng": run.saved_state()["loader_rng"], "host": host_name(),
            "carried": dict(run.carried)}


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
        run.resume_carried = dict(mine.get("carried") or {})
        return
    run.resume_rng = {}  # restores nothing: the streams the script seeded go on
    run.record_event(EventKind.CHECKPOINT, "rank_fresh", f"rank {ranks.rank} is not in the "
                     f"checkpoint (taken on {len(parts)} ranks): it keeps the random streams "
                     "the script seeded", rank=ranks.rank)


def check_world_change(run: RunContext, saved_world: int | None, world_size: int) -> None:
    """A checkpoint taken mid-epoch on another number of ranks: the epoch's position is
    counted in global samples (the ranks' batches are interleaved shares of one order), and
    ``run.batches`` deals the rest of the epoch over the new world (``prudent.kernel.data``), or
    refuses a loader that does not deal its data that way. Recorded here, at the resume."""
    state = run.state
    if saved_world is None or saved_world == world_size:
        return
    done = state.batches_in_epoch * saved_world
    samples = (state.epoch_samples_before + done * state.batch_size
               if state.batch_size else None)
    where = ""
    if done or state.epoch_samples_before:
        where = (f"; {samples} samples of epoch {state.epoch + 1} already trained"
                 if samples is not None else
                 f"; {done} batches of epoch {state.epoch + 1} already trained")
        where += f", the rest of it dealt over {world_size} rank{'s' if world_size > 1 else ''}"
    run.record_event(EventKind.CHECKPOINT, "world_changed",
                     f"checkpoint taken on {saved_world} ranks, resumed on {world_size}{where}",
                     saved_world_size=saved_world, world_size=world_size, batches_done=done,
                     samples_done=samples)
