"""Is a snapshot worth keeping? Every floating-point tensor in it must be finite.

A periodic save can land between the step that poisoned the weights (a NaN gradient, an
overflow) and the rule that notices it; a small keep-K then lets NaN checkpoints push out the
good ones and a resume reloads NaN weights. The check runs on the writer's side (the
background thread in async mode), over the host copies: one fused ``torch._foreach_norm`` per
dtype (a NaN or infinite element makes its tensor's norm non-finite), and only when that
says something is wrong, a tensor-by-tensor pass that names the culprit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["first_non_finite", "tensors_in"]


def first_non_finite(snapshot: Any) -> str | None:
    """The path of the first tensor holding NaN or infinity (``objects.optimizer.state.3.exp_avg``),
    or None when every floating-point tensor is finite."""
    named = list(_float_tensors(snapshot, ()))
    if not named or _all_finite([t for _, t in named]):
        return None
    for path, tensor in named:
        if not bool(torch.isfinite(tensor).all()):
            return ".".join(map(str, path))
    return None  # the fused pass overflowed on finite values (norms above 3e38)


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    by_kind: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for tensor in tensors:
        by_kind.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    total = 0.0
    for group in by_kind.values():
        norms = torch._foreach_norm(group, 2, dtype=torch.float32)  # fp16/bf16 in fp32
        total += float(torch.stack(norms).sum())
    return math.isfinite(total)


def tensors_in(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """Every tensor reachable through ``obj``'s dicts, lists and tuples, with its path."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors_in(value, (*path, key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors_in(value, (*path, i))


def _float_tensors(obj: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    for at, tensor in tensors_in(obj, path):
        if ((tensor.is_floating_point() or tensor.is_complex()) and tensor.numel()
                and not tensor.is_sparse):
            yield at, tensor.detach()
