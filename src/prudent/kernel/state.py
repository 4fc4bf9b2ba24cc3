"""The run's counters: what a checkpoint needs to know of where the loop is."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RunState"]


@dataclass
class RunState:
    """Counters the kernel advances; components read them, checkpoints save them.

    ``step`` counts completed ``run.step()`` calls over the whole run; ``epoch`` is the epoch
    in progress (0-based); ``batches_in_epoch`` is how many batches of it were consumed;
    ``epoch_rng`` holds the generator states the epoch's shuffle order was drawn from;
    ``loader_rng`` the loader's own generators' states as the last epoch ended, until the next
    one starts (a checkpoint between epochs: the next order is drawn from them);
    ``world_size`` is the number of ranks the counters were kept on (a checkpoint resumed on
    another number carries the epoch's position over in global samples);
    ``batch_size`` the loader's per rank, and ``epoch_samples_before`` the samples of the
    epoch trained before ``batches_in_epoch`` counted (by another world, or before a resume
    that dealt the rest of the epoch anew): the epoch's position in global samples is
    ``epoch_samples_before + batches_in_epoch x batch_size x world_size``;
    ``num_steps`` is the planned number of optimizer steps: the ``n`` of ``run.steps(n)``, or
    a framework adapter's plan (``max_steps``, or epochs x optimizer steps per epoch); None for
    an epoch loop of one's own, whose plan is ``num_epochs`` x ``batches_per_epoch``.
    """

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0
    num_epochs: int | None = None
    batches_per_epoch: int | None = None
    num_steps: int | None = None
    epoch_rng: dict[str, Any] | None = None
    loader_rng: dict[str, Any] | None = None
    world_size: int | None = None
    batch_size: int | None = None
    epoch_samples_before: int = 0

    @property
    def planned_steps(self) -> int | None:
        """The run's planned length: ``num_steps``, or ``num_epochs`` x ``batches_per_epoch``
        (None while neither is known)."""
        if self.num_steps:
            return self.num_steps
        if self.num_epochs and self.batches_per_epoch:
            return self.num_epochs * self.batches_per_epoch
        return None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)
