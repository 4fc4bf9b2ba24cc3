"""Finding where a step went wrong: which rows of the batch, which samples, which layer.

- :class:`SampleIndexRecorder` notes which dataset indices each batch of a ``DataLoader`` was
  built from (it wraps the iterator's index stream: no data is read twice).
- :func:`non_finite_rows` finds the rows of a batch holding NaN or infinity.
- :class:`ForwardProbe` hooks every module for one forward pass and names the first whose output
  is not finite, with the rows that are (how a finite but extreme sample is found).
"""

from __future__ import annotations

import collections
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ForwardProbe", "IndexedBatches", "SampleIndexRecorder", "batch_size_of",
           "describe_batch", "float_or_text", "index_list", "local_shard", "non_finite_grads",
           "non_finite_rows", "tensors_in"]


class SampleIndexRecorder:
    """The dataset indices behind each batch a ``DataLoader`` iterator yields, in order.

    Works on PyTorch's map-style loader iterators by wrapping their index stream. With
    ``num_workers > 0`` the loader has already sent its first ``prefetch_factor * num_workers``
    index batches to the workers when prudent sees the iterator: those batches get ``None``.
    """

    def __init__(self, iterator: Any, keep: int | None = None) -> None:
        # keep: the newest sampler outputs kept (None: all, until next_batch takes them)
        self._queue: collections.deque[Any] = collections.deque(maxlen=keep)
        self._unknown = int(getattr(iterator, "_send_idx", 0) or 0)  # prefetched before us
        self._prefetched = self._unknown
        self._recorded = 0
        stream = iterator._sampler_iter
        iterator._sampler_iter = self._record(stream)

    @classmethod
    def install(cls, iterator: Any, keep: int | None = None) -> SampleIndexRecorder | None:
        from torch.utils.data import IterableDataset

        iterator = getattr(iterator, "source", iterator)  # another IndexedBatches' loader iterator
        if not hasattr(iterator, "_sampler_iter") or isinstance(
                getattr(iterator, "_dataset", None), IterableDataset):
            return None  # not a map-style DataLoader iterator: positions only
        if keep is not None:  # the workers' prefetched batches are drawn ahead of the loop
            ahead = int(getattr(iterator, "_prefetch_factor", 0) or 0) * int(
                getattr(iterator, "_num_workers", 0) or 0)
            keep = max(keep, 2 * ahead + 2)
        try:
            return cls(iterator, keep)
        except (AttributeError, TypeError):
            return None

    def _record(self, stream: Iterator[Any]) -> Iterator[Any]:
        queue = self._queue
        for index in stream:
            queue.append(index)
            self._recorded += 1
            yield index

    def next_batch(self) -> Any:
        """What the sampler gave for the batch just yielded, as is (``None`` when not known):
        turning it into ints per step would cost more than the rest of capture; see
        :func:`index_list`."""
        if self._unknown:
            self._unknown -= 1
            return None
        return self._queue.popleft() if self._queue else None

    def indices_of(self, number: int) -> Any:
        """What the sampler gave for the ``number``-th batch the iterator yielded (from 1), as
        is, for a recorder that keeps the newest outputs (``keep``) and is never asked
        :meth:`next_batch`: nothing is done per batch. ``None`` when not known (drawn before
        the recorder, or no longer kept)."""
        item = number - 1 - self._prefetched
        first_kept = self._recorded - len(self._queue)
        if item < first_kept or item >= self._recorded:
            return None
        return self._queue[item - first_kept]


def index_list(raw: Any) -> list[int] | None:
    """A sampler's index (or batch of indices) as a list of ints, when a bundle needs it."""
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)):
        return [_as_int(i) for i in raw]
    return [_as_int(raw)]


class IndexedBatches:
    """An epoch's iterator that notes each batch's dataset indices (``indices``) as it yields it.

    Several can wrap the same epoch (capture and replay): each records from the loader's own
    iterator, which ``source`` keeps reachable through the others.
    """

    def __init__(self, iterator: Any) -> None:
        self.source = getattr(iterator, "source", iterator)
        self._iterator = iterator
        self._recorder = SampleIndexRecorder.install(self.source)
        self.raw_indices: Any = None  # the sampler's output for the last batch (index_list)

    def __iter__(self) -> IndexedBatches:
        return self

    def __next__(self) -> Any:
        batch = next(self._iterator)
        self.raw_indices = self._recorder.next_batch() if self._recorder is not None else None
        return batch

    @property
    def indices(self) -> list[int] | None:
        """The dataset indices of the last batch."""
        return index_list(self.raw_indices)


def _as_int(index: Any) -> Any:
    return int(index) if isinstance(index, int) or hasattr(index, "__index__") else index


def tensors_in(obj: Any, path: str = "batch") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a batch (tensors, lists, tuples, dicts), with where it sits."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors_in(value, f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors_in(value, f"{path}[{i}]")


def batch_size_of(batch: Any) -> int | None:
    """The most common leading dimension among the batch's tensors."""
    sizes = [t.shape[0] for _, t in tensors_in(batch) if t.dim() > 0]
    return collections.Counter(sizes).most_common(1)[0][0] if sizes else None


def non_finite_rows(batch: Any) -> dict[int, list[str]]:
    """Row -> the batch tensors in which that row holds NaN or infinity."""
    size = batch_size_of(batch)
    rows: dict[int, list[str]] = {}
    for where, tensor in tensors_in(batch):
        if size is None or tensor.dim() == 0 or tensor.shape[0] != size:
            continue
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        bad = ~torch.isfinite(tensor.detach().reshape(size, -1)).all(dim=1)
        for row in bad.nonzero().flatten().tolist():
            rows.setdefault(int(row), []).append(where)
    return rows


def non_finite_grads(named_params: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the parameters whose gradient holds NaN or infinity (one host sync). A
    sharded gradient (FSDP2's DTensor) is judged by this rank's shard: no collective, so a
    rank may call it alone (a NaN in one rank's batch reaches every shard through the
    gradient reduction anyway)."""
    named = [(name, p.grad) for name, p in named_params if p.grad is not None]
    if not named:
        return []
    norms = torch._foreach_norm([local_shard(g.detach()) for _, g in named])
    device = norms[0].device
    finite = torch.isfinite(torch.stack([n.to(device) for n in norms])).tolist()
    return [name for (name, _), ok in zip(named, finite) if not ok]


def local_shard(tensor: Any) -> Any:
    """This rank's shard of a DTensor (FSDP2's sharded parameters, their gradients and
    optimizer state), a plain tensor; any other value as it is."""
    module = sys.modules.get("torch.distributed.tensor")  # not imported: nothing is a DTensor
    dtensor = getattr(module, "DTensor", None)
    return tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor) else tensor


def describe_batch(batch: Any, limit: int = 6) -> str:
    """``batch[0]: float32[32, 8] cpu, batch[1]: int64[32] cpu``."""
    parts = [f"{where}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)} {t.device}"
             for where, t in tensors_in(batch)]
    more = f", ... ({len(parts) - limit} more)" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more if parts else type(batch).__name__


class ForwardProbe:
    """Forward hooks on every submodule for one pass: the first non-finite output wins."""

    def __init__(self, modules: dict[str, torch.nn.Module], batch_size: int | None) -> None:
        self.batch_size = batch_size
        self.first: dict[str, Any] | None = None
        self._handles = []
        for key, module in modules.items():
            for name, sub in module.named_modules():
                label = f"{key}.{name}" if len(modules) > 1 and name else (name or key)
                self._handles.append(sub.register_forward_hook(self._hook(label)))

    def _hook(self, label: str) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if self.first is not None:
                return
            for _, tensor in tensors_in(output, "output"):
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    self.first = {"module": label, "type": type(module).__name__,
                                  "rows": self._rows(tensor),
                                  "inputs_finite": all(bool(torch.isfinite(t).all())
                                                       for _, t in tensors_in(inputs)
                                                       if t.is_floating_point())}
                    return
        return hook

    def _rows(self, tensor: torch.Tensor) -> list[int]:
        if tensor.dim() == 0 or tensor.shape[0] != self.batch_size:
            return []
        bad = ~torch.isfinite(tensor.detach().reshape(tensor.shape[0], -1)).all(dim=1)
        return [int(r) for r in bad.nonzero().flatten().tolist()]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def float_or_text(value: float) -> float | str:
    """JSON has no NaN or infinity: those are written as text."""
    return value if math.isfinite(value) else str(value)
