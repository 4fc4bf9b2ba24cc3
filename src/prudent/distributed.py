"""Running under ``torchrun``: one writer, every rank restored, all ranks stopping together.

Rank 0 registers the run, writes metrics, events and checkpoints; the other ranks write
nothing and restore from rank 0's checkpoint (their RNG included: exact when every rank seeds
alike, which DDP scripts do). A stop requested on any rank (a signal, a rule, a budget) takes
effect on every rank at the same step: each step the ranks agree through one tiny
``all_reduce``, so no rank is left waiting in a collective for a peer that has gone.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prudent.events import Component
from prudent.stop import StopReason

if TYPE_CHECKING:
    from prudent.context import RunContext

__all__ = ["Ranks", "StopCoordinator", "ranks_from_env"]


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def ranks_from_env(environ: Mapping[str, str] | None = None) -> Ranks:
    """The ranks torchrun (or SLURM via torchrun) sets in the environment."""
    env = os.environ if environ is None else environ
    return Ranks(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                 int(env.get("LOCAL_RANK", 0)))


class StopCoordinator(Component):
    """Turns one rank's stop request into every rank's stop, at the same step.

    The run holds its own stop requests back (``run.defer_stops``) until this component has
    heard from every rank; must be the first ``on_step_end`` handler, so that the checkpointer
    sees the agreed stop.
    """

    name = "distributed"

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self._warned = False

    def on_start(self, run: RunContext) -> None:
        run.defer_stops = True

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self._not_initialized(run)
            return
        device = run.device if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if run.stop_requested else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not int(flag.item()):
            return
        requests: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(requests, run.pending_stop)
        reason = next(r for r in requests if r is not None)
        origin = requests.index(reason)
        if origin != self.ranks.rank:
            reason = StopReason(reason.kind, reason.rule,
                                f"{reason.message} (requested on rank {origin})")
        run.replace_stop(reason)
        run.defer_stops = False

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        run.defer_stops = False

    def _not_initialized(self, run: RunContext) -> None:
        run.defer_stops = False  # nothing to agree with: behave as a single process
        if not self._warned:
            self._warned = True
            warnings.warn("prudent runs under torchrun but torch.distributed is not initialised "
                          "when training starts: ranks cannot stop together. Call "
                          "dist.init_process_group() before the training loop", stacklevel=2)
