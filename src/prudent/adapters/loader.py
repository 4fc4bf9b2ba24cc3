"""ResumableLoader: a data loader a framework can put back mid-epoch, batch for batch.

A framework that restarts an interrupted epoch from a plain ``DataLoader`` shuffles it anew
and trains the first batches of the new order (Lightning does): the resumed run sees other
batches than the uninterrupted one. Wrapped in a :class:`ResumableLoader`, the loader tells
the framework where it is (``state_dict``: the generator states the epoch's order was drawn
from, the batches already trained, the RNG at the checkpoint) and, given that state back
(``load_state_dict``, before the epoch's iterator is made), draws the same order again, skips
the trained batches by index (no data loaded for them: ``prudent.kernel.data``) and restores the
RNG, so dropout and the rest continue exactly as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prudent.kernel.data import (
    epoch_start_state,
    loader_generator_states,
    restore_loader_generators,
    resume_iterator,
)
from prudent.kernel.rng import capture_rng, restore_rng

__all__ = ["ResumableLoader", "loader_length"]


class ResumableLoader:
    """Wraps an iterable loader (a ``DataLoader``); iterates, sizes and samples as it does.

    ``position`` tells how many batches of the epoch in progress were trained; the adapter's
    callback sets it (a framework reads a batch ahead, so the loader's own count is one off).
    ``epoch_length``: how many batches the framework trains an epoch (Lightning's
    ``limit_train_batches`` may make it fewer than the loader has); the loader's length if unset.
    """

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.position: Callable[[], int] | None = None
        self.epoch_length: Callable[[], int | None] | None = None
        self._epoch_rng: dict[str, Any] | None = None
        self._served = 0
        self._resume: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # batch_size, sampler, dataset: the loader's own
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        if resume and _trained_to_its_end(resume, self.loader):
            # saved after the epoch's last batch, before the framework moved on: it starts the
            # next epoch now (Lightning does), not the saved one again: no batch is skipped,
            # and the order is drawn from where the saved epoch left the generators
            if resume.get("rng"):
                restore_rng(resume["rng"])
            resume = {"loader_rng": resume.get("loader_rng")}
        if resume and resume.get("batches") and resume.get("epoch_rng") is not None:
            self._epoch_rng, self._served = resume["epoch_rng"], resume["batches"]
            saved_rng = resume.get("rng")
            iterator = resume_iterator(self.loader, resume["epoch_rng"], resume["batches"],
                                       after_skip=lambda: saved_rng and restore_rng(saved_rng))
        else:
            if resume and resume.get("loader_rng"):  # restored between epochs (state_dict)
                restore_loader_generators(self.loader, resume["loader_rng"])
            self._epoch_rng, self._served = epoch_start_state(self.loader), 0
            iterator = iter(self.loader)
        for batch in iterator:
            self._served += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        trained = self.position() if self.position is not None else self._served
        length = self.epoch_length() if self.epoch_length is not None else None
        # loader_rng: the loader's own generators now. The epoch's order was drawn when its
        # first batch was, and nothing else draws from them, so these are what the next
        # epoch's order comes from (a framework need not run the iterator out: Lightning
        # stops at the epoch's length), for a checkpoint between epochs or after the last batch
        return {"epoch_rng": self._epoch_rng, "batches": trained, "rng": capture_rng(),
                "loader_rng": loader_generator_states(self.loader),
                "epoch_batches": length if length is not None else loader_length(self.loader)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = dict(state)


def loader_length(loader: Any) -> int | None:
    """Batches an epoch of ``loader`` has (None: it has no length)."""
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None


def _trained_to_its_end(state: dict[str, Any], loader: Iterable[Any]) -> bool:
    """The saved position is after the epoch's last batch (a checkpoint from before
    ``epoch_batches`` was kept: the loader's length stands in)."""
    batches = state.get("batches") or 0
    length = state.get("epoch_batches") or loader_length(loader)
    return bool(batches) and length is not None and batches >= length
