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
only tensors are in the shards. The manifest lists every shard file with its size and
sha256 (rank 0 hashes them once they are durable, before the manifest commits them): a
checkpoint whose shards are missing or cut short is skipped like one without a manifest, and
before a load every rank checks the hashes of its share of the files and of DCP's
``.metadata``, which DCP unpickles: prudent unpickles only what it wrote. The shards go
through DCP's file-system writer locally and its fsspec writer on an object store, opened
like the rest of the location.
"""

from __future__ import annotations

import hashlib
import sys
from typing import TYPE_CHECKING, Any

import torch

from prudent.errors import ConfigError

if TYPE_CHECKING:
    from prudent.checkpoint.storage import CheckpointStorage

__all__ = ["SHARDS_SUFFIX", "corrupted_shards", "holds_shards", "is_sharded_entry",
           "load_sharded", "missing_shards", "module_pairs", "owner_of", "save_sharded",
           "shard_digests", "sharded_objects", "shards_folder_of"]

SHARDS_SUFFIX = ".shards"
METADATA_FILE = ".metadata"  # DCP's index of the shards (pickled)
_MARK = "__prudent_shards__"
_CHUNK = 8 << 20


def holds_shards(obj: Any) -> bool:
    """A module whose parameters are DTensors (FSDP2's ``fully_shard``), or an optimizer of
    such parameters."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return False
    if isinstance(obj, torch.nn.Module):
        return any(isinstance(p, dtensor) for p in obj.parameters())
    if isinstance(obj, torch.optim.Optimizer):
        return any(isinstance(p, dtensor) for group in obj.param_groups for p in group["params"])
    return False


def sharded_objects(objects: dict[str, Any]) -> dict[str, tuple[torch.nn.Module, Any]]:
    """``key -> (module, optimizer or None)`` for the attached objects saved through DCP: the
    sharded modules, and each optimizer of their parameters (paired with its module)."""
    return module_pairs(objects, sharded_only=True)


def module_pairs(objects: dict[str, Any], sharded_only: bool = False
                 ) -> dict[str, tuple[torch.nn.Module, Any]]:
    """``key -> (module, optimizer or None)`` for every attached model (or every sharded one)
    and each optimizer of its parameters: what DCP saves from or reads shards into."""
    modules = {key: obj for key, obj in objects.items()
               if isinstance(obj, torch.nn.Module) and (not sharded_only or holds_shards(obj))}
    found: dict[str, tuple[torch.nn.Module, Any]] = {k: (m, None) for k, m in modules.items()}
    for key, obj in objects.items():
        if isinstance(obj, torch.optim.Optimizer):
            owner = owner_of(obj, modules.values())
            if owner is not None:
                found[key] = (owner, obj)
    return found


def save_sharded(objects: dict[str, tuple[torch.nn.Module, Any]], storage: CheckpointStorage,
                 folder: str, group: Any,
                 asynchronous: bool = False) -> tuple[dict[str, Any], Any]:
    """Every rank writes its shards of ``objects`` into ``storage``'s folder ``folder`` (a
    collective); returns
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
        kept[key] = {_MARK: folder,
                     "plain": {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}}
    writer = storage.dcp_writer(folder)
    if asynchronous:
        return kept, dcp.async_save(tensors, storage_writer=writer, process_group=group)
    dcp.save(tensors, storage_writer=writer, process_group=group)
    return kept, None


def shard_digests(storage: CheckpointStorage, folder: str) -> dict[str, dict[str, Any]]:
    """Each file of a written shards folder with its size and sha256, for the manifest."""
    sizes = storage.file_sizes(folder)
    if METADATA_FILE not in sizes:
        raise OSError(f"{folder} has no {METADATA_FILE}: not every rank's shards were written")
    return {name: {"sha256": _sha256(storage, folder, name), "bytes": size}
            for name, size in sorted(sizes.items())}


def missing_shards(storage: CheckpointStorage, folder: str,
                   expected: dict[str, dict[str, Any]]) -> str | None:
    """Why the shards folder does not hold the files the manifest lists (one listing), or None."""
    sizes = storage.file_sizes(folder)
    for name, entry in sorted(expected.items()):
        if name not in sizes:
            return f"is missing its shard file {folder}/{name}"
        if sizes[name] != entry["bytes"]:
            return f"has a truncated shard file {folder}/{name} ({sizes[name]} of {entry['bytes']} bytes)"
    return None


def corrupted_shards(storage: CheckpointStorage, folder: str, expected: dict[str, dict[str, Any]],
                     rank: int, world_size: int) -> list[str]:
    """The files of this rank's share (every ``world_size``-th, and always DCP's ``.metadata``,
    which this rank unpickles) whose sha256 is not the manifest's: each byte read once over
    the ranks."""
    names = sorted(expected)
    share = {name for i, name in enumerate(names) if i % world_size == rank} | {METADATA_FILE}
    return [f"{folder}/{name}" for name in sorted(share)
            if name in expected and _sha256(storage, folder, name) != expected[name]["sha256"]]


def _sha256(storage: CheckpointStorage, folder: str, name: str) -> str:
    digest = hashlib.sha256()
    with storage.open_read(folder, name) as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_sharded_entry(saved: Any) -> bool:
    return isinstance(saved, dict) and _MARK in saved


def shards_folder_of(saved: dict[str, Any]) -> str:
    """The one shards folder the checkpoint's sharded entries name."""
    folders = {entry[_MARK] for entry in saved.values()}
    if len(folders) != 1:
        raise ConfigError(f"the checkpoint names several shard folders {sorted(folders)}")
    return str(folders.pop())


def load_sharded(objects: dict[str, tuple[torch.nn.Module, Any]], saved: dict[str, Any],
                 storage: CheckpointStorage, group: Any) -> None:
    """Read each object's shards back (resharded to this world) and load them in place; the
    caller has checked the folder's files against the manifest (:func:`corrupted_shards`)."""
    import torch.distributed.checkpoint as dcp

    folder = shards_folder_of(saved)
    states = {key: _state_dict(module, optimizer) for key, (module, optimizer) in objects.items()}
    tensors = {f"{key}/{k}": v for key, state in states.items() for k, v in state.items()
               if isinstance(v, torch.Tensor)}
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(tensors, storage_reader=storage.dcp_reader(folder), process_group=group)
    except (Exception, CheckpointException) as exc:  # a BaseException: DCP's own, per rank
        reason = str(exc).strip().splitlines()[-1]
        raise ConfigError(f"cannot read the sharded state at {storage.url}/{folder} ({reason}): the "
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


def owner_of(optimizer: Any, modules: Any) -> torch.nn.Module | None:
    """The module among ``modules`` whose parameters ``optimizer`` updates."""
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        if any(id(p) in params for p in module.parameters()):
            return module
    return None


def _dtensor_type() -> Any:
    module = sys.modules.get("torch.distributed.tensor")  # not imported: nothing is a DTensor
    return getattr(module, "DTensor", None)
