"""Where the loop is in the data, and how to get back there after a restart.

At the start of each epoch the run notes the generator states that decide the shuffle order
(before the loader draws them). To resume mid-epoch it puts those states back, rebuilds the
same order, skips the batches already trained on at the index level (no data is loaded for
them) and only then restores the RNG as it was at the checkpoint, so dropout and the rest
continue exactly. Loaders that cannot be skipped by index are read and discarded instead: those
that are not plain DataLoaders over map-style datasets, and those with workers (each worker's
generator is advanced by every sample it loads, so its augmentations depend on what it loaded).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["continue_epoch_at", "epoch_start_state", "loader_generator_states",
           "restore_loader_generators", "resume_iterator", "shards_by_rank"]


def epoch_start_state(loader: Iterable[Any]) -> dict[str, Any]:
    """The generator states a fresh ``iter(loader)`` is about to draw from."""
    return {"torch": torch.get_rng_state(), **loader_generator_states(loader)}


def loader_generator_states(loader: Iterable[Any]) -> dict[str, Any]:
    """The states of the loader's own generators now (none: an empty dict). Between epochs
    they are what the next epoch's shuffle order is drawn from; a script that seeds them when
    it starts makes them new again, so a run restored between epochs puts these back."""
    return {key: generator.get_state() for key, generator in _generators(loader).items()}


def restore_loader_generators(loader: Iterable[Any], states: dict[str, Any]) -> None:
    """Put back what :func:`loader_generator_states` returned (keys the loader has)."""
    for key, generator in _generators(loader).items():
        if key in states:
            generator.set_state(states[key])


def resume_iterator(loader: Iterable[Any], epoch_state: dict[str, Any], num_skip: int,
                    after_skip: Callable[[], None]) -> Iterator[Any]:
    """An iterator over ``loader`` that continues after ``num_skip`` already-seen batches."""
    torch.set_rng_state(epoch_state["torch"])
    restore_loader_generators(loader, epoch_state)
    skipping = _index_skipping_loader(loader, num_skip, after_skip)
    if skipping is not None:
        return iter(skipping)
    warnings.warn(f"prudent resumes this {type(loader).__name__} by reading and discarding "
                  f"{num_skip} batches: {_why_read(loader)}", stacklevel=3)
    iterator = iter(loader)
    for _ in range(num_skip):
        next(iterator, None)
    after_skip()
    return iterator


def shards_by_rank(loader: Iterable[Any]) -> bool:
    """The loader gives each rank an interleaved share of one order (a DistributedSampler):
    the first ``n`` batches of every rank are then the order's first ``n x ranks`` batches,
    whatever the number of ranks, so a position carries over to another world exactly."""
    from torch.utils.data import DistributedSampler

    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    return isinstance(sampler, DistributedSampler) or isinstance(inner, DistributedSampler)


def continue_epoch_at(loader: Iterable[Any], start: int,
                      after_start: Callable[[], None]) -> DataLoader[Any] | None:
    """The rest of a ``DistributedSampler`` epoch from global sample ``start`` on, dealt over
    this world's ranks as the sampler deals a whole epoch (None: not such a loader).

    Whatever the number of ranks, the ranks' first batches together are a prefix of the
    epoch's one order (the sampler interleaves it): ``start`` samples trained on any world,
    or on several one after another, are the order's first ``start``. The rest is dealt
    rank by rank again, each sample once; only where a rank would then take a step fewer
    than the others is it padded as the sampler pads (cut, with its ``drop_last``)."""
    from torch.utils.data import BatchSampler, DistributedSampler

    sampler = getattr(loader, "sampler", None)
    if type(loader) is not DataLoader or type(sampler) is not DistributedSampler \
            or loader.batch_size is None:
        return None
    whole = DistributedSampler(sampler.dataset, num_replicas=1, rank=0,  # type: ignore[arg-type]
                               shuffle=sampler.shuffle, seed=sampler.seed)
    whole.set_epoch(sampler.epoch)
    rest = list(whole)[start:]
    world, size = sampler.num_replicas, loader.batch_size
    if sampler.drop_last:
        rest = rest[:len(rest) - len(rest) % world]
    elif _steps(len(rest) // world, size, loader.drop_last) != \
            _steps(-(-len(rest) // world), size, loader.drop_last):
        # a rank would take a step fewer (DDP would hang): pad as the sampler pads, a few
        # samples trained twice; otherwise the ranks' last batches differ by one sample
        rest += (rest * world)[:world - len(rest) % world]
    mine = _SkipFirst(rest[sampler.rank::world], 0, after_start)
    batches = BatchSampler(mine, loader.batch_size, loader.drop_last)
    return DataLoader(loader.dataset, batch_sampler=batches, **_options(loader))


def _steps(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


def _generators(loader: Iterable[Any]) -> dict[str, torch.Generator]:
    found: dict[str, torch.Generator] = {}
    loader_generator = getattr(loader, "generator", None)
    if isinstance(loader_generator, torch.Generator):
        found["loader"] = loader_generator
    sampler_generator = getattr(getattr(loader, "sampler", None), "generator", None)
    if isinstance(sampler_generator, torch.Generator) and sampler_generator is not loader_generator:
        found["sampler"] = sampler_generator
    return found


def _index_skipping_loader(loader: Iterable[Any], num_skip: int,
                           after_skip: Callable[[], None]) -> DataLoader[Any] | None:
    if type(loader) is not DataLoader or isinstance(loader.dataset, IterableDataset):
        return None
    if loader.num_workers > 0:
        # each worker's generator is seeded when the epoch starts and advanced by every sample
        # it loads (random crops): skipped by index, the rest would be augmented differently
        return None
    options = _options(loader)
    if loader.batch_sampler is not None:
        sampler = _SkipFirst(loader.batch_sampler, num_skip, after_skip)
        return DataLoader(loader.dataset, batch_sampler=sampler, **options)
    sampler = _SkipFirst(loader.sampler, num_skip, after_skip)
    return DataLoader(loader.dataset, batch_size=None, sampler=sampler, **options)


def _why_read(loader: Iterable[Any]) -> str:
    workers = getattr(loader, "num_workers", 0)
    if type(loader) is DataLoader and not isinstance(loader.dataset, IterableDataset) and workers:
        return (f"its {workers} workers draw their random numbers (augmentation) as they load, "
                "so the batches after the skipped ones come out the same only if the workers "
                "load the skipped ones first")
    return ("it is not a plain DataLoader over a map-style dataset, so batches cannot be "
            "skipped by index")


def _options(loader: DataLoader[Any]) -> dict[str, Any]:
    """What a copy of ``loader`` over other indices keeps of it (its workers, collation)."""
    options: dict[str, Any] = {
        "num_workers": loader.num_workers, "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory, "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn, "generator": loader.generator,
        "multiprocessing_context": loader.multiprocessing_context,
        "persistent_workers": False, "pin_memory_device": loader.pin_memory_device}
    if loader.num_workers > 0:
        options["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        options["in_order"] = loader.in_order
    return options


class _SkipFirst(torch.utils.data.Sampler[Any]):
    """Draws the wrapped sampler's order as usual, drops the first ``num_skip`` items, then
    calls ``after_skip`` (before any data of the remaining items is loaded)."""

    def __init__(self, sampler: Iterable[Any], num_skip: int, after_skip: Callable[[], None]):
        self.sampler, self.num_skip, self.after_skip = sampler, num_skip, after_skip

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.sampler)
        for _ in range(self.num_skip):
            next(iterator, None)
        self.after_skip()
        yield from iterator

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.num_skip)  # type: ignore[arg-type]
