"""State held in shards (FSDP2: DTensor parameters and optimizer state) goes through
``torch.distributed.checkpoint`` (DCP).

No rank holds an FSDP2 model whole, so rank 0 alone cannot save it (copying its DTensors
failed; gathering them is a collective every rank must join). At a save every rank takes
part in anyway (``prudent.checkpoint.manager``), each rank writes its own shards with
``dcp.save`` into ``<checkpoint>.shards`` beside the checkpoint folder, and the checkpoint's
``state.pt`` names that folder; its manifest, written last, is still the commit marker (DCP's
own ``.metadata`` is written after every rank's shards, before rank 0 writes the manifest).
A load reshards to the world it resumes on (DCP's resharding), so 2 ranks' shards load on 1
or 4. Model and optimizer go through ``torch.distributed.checkpoint.state_dict``, whose keys are
parameter names: the optimizer's plain numbers (learning rate, betas) stay in ``state.pt``,
only tensors are in the shards. DCP reads its ``.metadata`` with pickle: a shards folder is
trusted as much as the location it is in (the rest of a checkpoint loads with
``weights_only=True``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from prudent.errors import ConfigError

__all__ = ["SHARDS_SUFFIX", "holds_shards", "is_sharded_entry", "load_sharded", "save_sharded",
           "sharded_objects"]

SHARDS_SUFFIX = ".shards"
_MARK = "__prudent_shards__"


def holds_shards(obj: Any) -> bool:
    """A module whose parameters are DTensors (FSDP2's ``fully_shard``)."""
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(obj, torch.nn.Module):
        return False
    return any(isinstance(p, dtensor) for p in obj.parameters())


def sharded_objects(objects: dict[str, Any]) -> dict[str, tuple[torch.nn.Module, Any]]:
    """``key -> (module, optimizer or None)`` for the attached objects saved through DCP: the
    sharded modules, and each optimizer of their parameters (paired with its module)."""
    modules = {key: obj for key, obj in objects.items() if holds_shards(obj)}
    found: dict[str, tuple[torch.nn.Module, Any]] = {k: (m, None) for k, m in modules.items()}
    for key, obj in objects.items():
        if isinstance(obj, torch.optim.Optimizer):
            owner = _owner(obj, modules.values())
            if owner is not None:
                found[key] = (owner, obj)
    return found


def save_sharded(objects: dict[str, tuple[torch.nn.Module, Any]], folder: str, group: Any,
                 asynchronous: bool = False) -> tuple[dict[str, Any], Any]:
    """Every rank writes its shards of ``objects`` into ``folder`` (a collective); returns
    what ``state.pt`` keeps for each key (the folder's name and the plain numbers) and, when
    ``asynchronous``, the future of the write: ``dcp.async_save`` returns once the shards are
    copied to host memory (the loop goes on; its next step cannot change what is written),
    its thread writes them. ``group`` must then be one no other collective uses meanwhile."""
    import torch.distributed.checkpoint as dcp

    tensors: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    for key, (module, optimizer) in objects.items():
        state = _state_dict(module, optimizer)
        tensors.update({f"{key}/{k}": v for k, v in state.items() if isinstance(v, torch.Tensor)})
        kept[key] = {_MARK: folder.rstrip("/").rsplit("/", 1)[-1],
                     "plain": {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}}
    if asynchronous:
        return kept, dcp.async_save(tensors, checkpoint_id=folder, process_group=group)
    dcp.save(tensors, checkpoint_id=folder, process_group=group)
    return kept, None


def is_sharded_entry(saved: Any) -> bool:
    return isinstance(saved, dict) and _MARK in saved


def load_sharded(objects: dict[str, tuple[torch.nn.Module, Any]], saved: dict[str, Any],
                 location: str, group: Any) -> None:
    """Read each object's shards back (resharded to this world) and load them in place."""
    import torch.distributed.checkpoint as dcp

    folders = {entry[_MARK] for entry in saved.values()}
    if len(folders) != 1:
        raise ConfigError(f"the checkpoint names several shard folders {sorted(folders)}")
    folder = f"{location.rstrip('/')}/{folders.pop()}"
    states = {key: _state_dict(module, optimizer) for key, (module, optimizer) in objects.items()}
    tensors = {f"{key}/{k}": v for key, state in states.items() for k, v in state.items()
               if isinstance(v, torch.Tensor)}
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(tensors, checkpoint_id=folder, process_group=group)
    except (Exception, CheckpointException) as exc:  # a BaseException: DCP's own, per rank
        reason = str(exc).strip().splitlines()[-1]
        raise ConfigError(f"cannot read the sharded state at {folder!r} ({reason}): the "
                          "checkpoint's shards are missing or incomplete: remove that "
                          "checkpoint to resume from the one before") from None
    for key, (module, optimizer) in objects.items():
        state = states[key]
        for name, tensor in tensors.items():
            if name.startswith(f"{key}/"):
                state[name[len(key) + 1:]] = tensor
        state.update(saved[key]["plain"])
        _load_state_dict(module, optimizer, state)


def _state_dict(module: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    if optimizer is None:
        return dict(get_model_state_dict(module))
    return dict(get_optimizer_state_dict(module, optimizer, options=_flat()))


def _load_state_dict(module: torch.nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if optimizer is None:
        set_model_state_dict(module, state)
    else:
        set_optimizer_state_dict(module, optimizer, state, options=_flat())


def _flat() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _owner(optimizer: Any, modules: Any) -> torch.nn.Module | None:
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        if any(id(p) in params for p in module.parameters()):
            return module
    return None


def _dtensor_type() -> Any:
    module = sys.modules.get("torch.distributed.tensor")  # not imported: nothing is a DTensor
    return getattr(module, "DTensor", None)
