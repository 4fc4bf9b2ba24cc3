"""The structure of a batch: every tensor in it by path, with its shape and dtype.

Preflight compares these signatures across batches (and between the model's inputs in training
and in evaluation) to find what would only break later: a dtype that differs, a key that
appears, a last batch smaller than the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["Leaf", "batch_size", "compare", "describe", "fingerprint", "nonfinite_samples",
           "signature"]

Leaf = tuple[str, tuple[int, ...] | None, str]  # path, shape (None: not a tensor), dtype or type
_MAX_LEAVES = 64


def signature(obj: Any, path: str = "batch") -> list[Leaf]:
    """Every leaf of a nested batch (tensors, arrays, numbers), in a stable order."""
    leaves: list[Leaf] = []
    _walk(obj, path, leaves)
    return leaves[:_MAX_LEAVES]


def _walk(obj: Any, path: str, leaves: list[Leaf]) -> None:
    if len(leaves) >= _MAX_LEAVES:
        return
    shape = getattr(obj, "shape", None)
    dtype = getattr(obj, "dtype", None)
    if shape is not None and dtype is not None:  # torch tensors and numpy arrays
        leaves.append((path, tuple(int(n) for n in shape), str(dtype).removeprefix("torch.")))
    elif isinstance(obj, Mapping):
        for key in obj:
            _walk(obj[key], f"{path}[{key!r}]", leaves)
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, str):
        for i, item in enumerate(obj):
            _walk(item, f"{path}[{i}]", leaves)
    else:
        leaves.append((path, None, type(obj).__name__))


def batch_size(leaves: list[Leaf]) -> int | None:
    """The leading dimension the batch's tensors share (None when there is no tensor)."""
    sizes = {shape[0] for _, shape, _ in leaves if shape}
    return sizes.pop() if len(sizes) == 1 else (max(sizes) if sizes else None)


def describe(leaves: list[Leaf]) -> str:
    """``batch[0]: float32 (32, 64), batch[1]: int64 (32,)``"""
    return ", ".join(f"{p}: {t} {tuple(s)}" if s is not None else f"{p}: {t}"
                     for p, s, t in leaves)


def compare(reference: list[Leaf], other: list[Leaf]) -> list[str]:
    """How ``other`` differs from ``reference``, ignoring the leading (batch) dimension."""
    ref, oth = {p: (s, t) for p, s, t in reference}, {p: (s, t) for p, s, t in other}
    problems = [f"{p} is new" for p in oth if p not in ref]
    problems += [f"{p} is missing" for p in ref if p not in oth]
    for path in (p for p in ref if p in oth):
        (shape_a, type_a), (shape_b, type_b) = ref[path], oth[path]
        if type_a != type_b:
            problems.append(f"{path} is {type_b}, was {type_a}")
        elif shape_a is not None and shape_b is not None and (
                len(shape_a) != len(shape_b) or shape_a[1:] != shape_b[1:]):
            problems.append(f"{path} has shape {shape_b}, was {shape_a}")
    return problems


def nonfinite_samples(obj: Any, path: str = "batch") -> list[dict[str, Any]]:
    """Floating tensors of the batch holding NaN or inf: where, and which samples (rows)."""
    import torch

    found: list[dict[str, Any]] = []
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            bad = ~torch.isfinite(obj)
            if bool(bad.any()):
                rows = bad.reshape(bad.shape[0], -1).any(1) if bad.dim() > 0 else bad.reshape(1)
                found.append({"path": path, "rows": rows.nonzero().flatten().tolist()[:10]})
    elif isinstance(obj, Mapping):
        for key in obj:
            found += nonfinite_samples(obj[key], f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            found += nonfinite_samples(item, f"{path}[{i}]")
    elif isinstance(obj, float) and not math.isfinite(obj):
        found.append({"path": path, "rows": []})
    return found


def fingerprint(obj: Any, digest: Any) -> None:
    """Feed every tensor and plain value of a nested structure into ``digest`` (a hashlib
    object): two batches with the same fingerprint hold the same numbers."""
    import torch

    if isinstance(obj, torch.Tensor):
        data = obj.detach().cpu().contiguous().view(-1)
        digest.update(f"{data.dtype}{tuple(obj.shape)}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    elif isinstance(obj, Mapping):
        for key in obj:
            digest.update(repr(key).encode())
            fingerprint(obj[key], digest)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            fingerprint(item, digest)
    else:
        digest.update(repr(obj).encode())
