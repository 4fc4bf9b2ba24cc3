"""A framework's checkpoint file serialised on the checkpoint writer's thread.

An adapter's framework writes its own checkpoint (Lightning's ``trainer.save_checkpoint``):
``torch.save`` of a dict holding the model's and the optimizer's tensors. Serialised on the
training thread, that is the whole save's cost there (a zip record and a CRC of every byte,
then copies of the bytes): 40 ms at 35 MB, seconds at a few GB. Wrapped in a
:class:`DeferredFile`, the training thread only copies the dict's tensors into host buffers
with the rest of the snapshot (``SnapshotBuffers``), and the writer thread makes the same
bytes from those copies (:func:`resolve`).
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import torch

from prudent.checkpoint.finite import tensors_in

__all__ = ["DeferredFile", "resolve", "snapshot"]


class DeferredFile:
    """The bytes ``serialise(obj)`` makes (``torch.save`` by default), to be made later.
    ``obj`` holds live tensors until :func:`snapshot` copies it; until then only the thread
    that changes them may resolve it."""

    __slots__ = ("obj", "serialise")

    def __init__(self, obj: Any, serialise: Callable[[Any], bytes] | None = None) -> None:
        self.obj = obj
        self.serialise = serialise

    def to_tensor(self) -> torch.Tensor:
        """The bytes as a uint8 tensor (how a framework's file is stored in ``state.pt``);
        ``torch.save``'s share the serialiser's buffer: no copy of them."""
        if self.serialise is not None:
            return torch.frombuffer(bytearray(self.serialise(self.obj)), dtype=torch.uint8)
        buffer = io.BytesIO()
        torch.save(self.obj, buffer)
        return torch.frombuffer(buffer.getbuffer(), dtype=torch.uint8)


def snapshot(deferred: DeferredFile, host_buffer: Callable[[torch.Tensor, tuple[Any, ...]], Any],
             path: tuple[Any, ...]) -> DeferredFile | torch.Tensor:
    """A copy of ``deferred`` that later steps of the training loop cannot change: each tensor
    reachable through dicts, lists and tuples gets ``host_buffer(tensor, path)`` (a host
    tensor the caller fills), everything else a deep copy, types kept (a module state dict's
    ``OrderedDict`` and its ``_metadata``). An object that cannot be copied so (a tensor
    subclass, a sparse tensor, something ``deepcopy`` refuses) is serialised now, on the
    calling thread, as it was before deferral: the bytes are right, only sooner."""
    found = list(tensors_in(deferred.obj, path))
    if not all(_plain(tensor) for _, tensor in found):
        return deferred.to_tensor()
    memo: dict[int, Any] = {}
    for at, tensor in found:
        if id(tensor) not in memo:
            memo[id(tensor)] = host_buffer(tensor, at)
    try:
        return DeferredFile(copy.deepcopy(deferred.obj, memo), deferred.serialise)
    except Exception:  # noqa: BLE001 - anything deepcopy refuses: the bytes now, as before
        return deferred.to_tensor()


def resolve(obj: Any) -> Any:
    """``obj`` with every :class:`DeferredFile` in its dicts, lists and tuples replaced by its
    bytes as a uint8 tensor (on the writer's thread, from a snapshot)."""
    if isinstance(obj, DeferredFile):
        return obj.to_tensor()
    if isinstance(obj, dict):
        return {k: resolve(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolve(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(resolve(v) for v in obj)
    return obj


def _plain(tensor: torch.Tensor) -> bool:
    """A dense tensor whose bytes a host buffer of its shape and dtype holds exactly."""
    return (type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.layout == torch.strided
            and not tensor.is_quantized and not tensor.is_meta)
