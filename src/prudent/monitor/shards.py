"""ShardedNorms: the norms of sharded parameters (FSDP2's DTensor), made global across ranks.

Under FSDP2 (``fully_shard``) a parameter and its gradient are DTensors split along dim 0
across the ranks of a mesh: each rank holds one shard. A norm is taken on the local shard,
and the global one is sqrt(sum over the shards of the squared local norms): one all_reduce
of one number per parameter (float64: a square never overflows) on the mesh's process group,
on the steps the monitor measures, never on the others.

Every rank must make the same collective calls in the same order, so the steps that measure
are agreed, never decided by a rank from what it alone sees (its loss, its clock, a NaN in
its own batch): each all_reduce also carries the leader's plan (rank 0 of the group: its
stride, whether to sample the layers now, the steps to its next sample) and every rank's
wish to look closer (a jump in its own loss); the next measuring step is then read from the
reduced numbers, the same on every rank. With parameters sharded over several groups (2-D
meshes) the plan travels in one more all_reduce, over every rank (the leader: global rank 0).

What stays local: a gradient placed ``Partial`` (not reduced yet; FSDP2 never leaves one in
``.grad``) is read as its local part, and a plain tensor beside the DTensors as this rank's
own (under a ``fully_shard``-ed root every parameter is a DTensor; a plain one is the same on
every rank only if something keeps it so).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ShardedNorms"]


@dataclass(frozen=True)
class _Plan:
    """Which parameters each process group sums over, for one list of parameters."""

    groups: list[tuple[Any, list[bool]]]  # a group, and which parameters are sharded over it
    leader: bool  # this rank's plan is the one every rank follows


class ShardedNorms:
    """Local norms of DTensors, and the all_reduce that makes them global."""

    def __init__(self, dtensor: type) -> None:
        self._dtensor = dtensor
        self._plans: dict[tuple[int, ...], _Plan] = {}

    @classmethod
    def find(cls, params: Sequence[Any]) -> ShardedNorms | None:
        """One for ``params`` if any of them is a DTensor, else None (costs nothing when the
        program never imported ``torch.distributed.tensor``: then none can be one)."""
        module = sys.modules.get("torch.distributed.tensor")
        dtensor = getattr(module, "DTensor", None)
        if dtensor is None or not any(isinstance(p, dtensor) for p in params):
            return None
        return cls(dtensor)

    def local(self, tensor: Any) -> Any:
        """This rank's part of ``tensor`` (a live view of its shard), or the tensor itself."""
        return tensor.to_local() if isinstance(tensor, self._dtensor) else tensor

    def local_norms(self, tensors: Sequence[Any], device: Any) -> Any:
        """The L2 norm of each tensor's local part, stacked (float32) on ``device``."""
        import torch

        if not tensors:
            return torch.zeros(0, dtype=torch.float32, device=device)
        norms = torch._foreach_norm([self.local(t) for t in tensors], 2, dtype=torch.float32)
        return torch.stack([n.to(device) for n in norms])

    def reduce(self, params: Sequence[Any], local_norms: Any, plan: Sequence[float] = (),
               wishes: Sequence[float] = ()) -> tuple[list[float], list[float]]:
        """Global norms from ``local_norms`` (entry ``i`` the local norm of ``params[i % n]``),
        with the agreed numbers: the leader's ``plan``, then every rank's ``wishes`` summed.
        A collective: every rank calls it at the same point, with parameters alike."""
        import torch

        layout = self._plan(params)
        squares = local_norms.double().square()
        size = squares.numel()
        extra = [float(v) if layout.leader else 0.0 for v in plan] + [float(v) for v in wishes]
        vector = torch.cat([squares, torch.tensor(extra, dtype=torch.float64,
                                                  device=squares.device)])
        repeat = size // len(params) if params else 0
        single = len(layout.groups) == 1
        for group, sharded in layout.groups:
            vector = _sum_over(group, vector, sharded * repeat + [single] * len(extra))
        if extra and len(layout.groups) > 1:
            vector = _sum_over(None, vector, [False] * size + [True] * len(extra))
        values = vector.tolist()
        return [math.sqrt(v) for v in values[:size]], values[size:]

    def _plan(self, params: Sequence[Any]) -> _Plan:
        key = tuple(map(id, params))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan_for(params, self._dtensor)
        return plan


def _plan_for(params: Sequence[Any], dtensor: type) -> _Plan:
    import torch.distributed as dist

    groups: list[tuple[Any, list[bool]]] = []
    for i, param in enumerate(params):
        if not isinstance(param, dtensor):
            continue
        mesh = param.device_mesh  # type: ignore[attr-defined]
        for dim, placement in enumerate(param.placements):  # type: ignore[attr-defined]
            if placement.is_replicate() or placement.is_partial():
                continue  # Shard, and any strided kind of it: the shards partition the tensor
            group = mesh.get_group(dim)
            entry = next((e for e in groups if e[0] is group), None)
            if entry is None:
                entry = (group, [False] * len(params))
                groups.append(entry)
            entry[1][i] = True
    # one group: the plan rides in its all_reduce; several: in one more, over every rank
    group = groups[0][0] if len(groups) == 1 else None
    return _Plan(groups, not groups or dist.get_rank(group) == 0)


def _sum_over(group: Any, vector: Any, chosen: list[bool]) -> Any:
    """``vector`` with its ``chosen`` entries summed over ``group`` (None: every rank)."""
    import torch
    import torch.distributed as dist

    if all(chosen):
        dist.all_reduce(vector, group=group)
        return vector
    keep = torch.tensor(chosen, dtype=torch.bool, device=vector.device)
    part = torch.where(keep, vector, 0.0)
    dist.all_reduce(part, group=group)
    return torch.where(keep, part, vector)
