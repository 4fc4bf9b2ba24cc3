"""Models and optimizers are saved through ``torch.distributed.checkpoint`` (DCP), whatever
their parallelism: one process, DDP or FSDP2.

Their state is taken with ``torch.distributed.checkpoint.state_dict``, whose keys are a
parameter's own names (no ``module.`` of DDP, no ``_orig_mod.`` of ``torch.compile``, the
optimizer's state by parameter name, not position), and its tensors are written with DCP into
``<checkpoint>.shards`` beside the checkpoint folder; the checkpoint's ``state.pt`` names that
folder and keeps the plain numbers (learning rate, betas) and everything else (schedulers,
counters, generators). Who writes the shards is the only difference:

- state held in shards (FSDP2: DTensor parameters): no rank holds the model whole, so every
  rank writes its own shards (``dcp.async_save``, a collective at a save every rank takes
  part in, ``prudent.checkpoint.manager``);
- replicated state (DDP) and one process: the state is whole on rank 0, so rank 0's writer
  thread writes it once from its host copy (``dcp.save(no_dist=True)``); the loop's stall is
  that copy alone, and rollbacks and ``keep`` need no other rank.

The manifest, written last, is the commit marker (DCP's own ``.metadata`` is written after the
shards, before the manifest). It lists every shard file with its size and sha256: a
checkpoint whose shards are missing or cut short is skipped like one without a manifest, and
before a load the files are hashed again against it, DCP's ``.metadata`` included, which DCP
unpickles: prudent unpickles only what it wrote. A load reshards to the world it resumes on
(DCP's resharding), so 2 ranks' shards load on 1 or 4, and shards load into a model that is
not sharded (``prudent.checkpoint.portable``). The shards go through DCP's file-system writer
locally and its fsspec writer on an object store, opened like the rest of the location.
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

import torch

from prudent.kernel.errors import ConfigError

if TYPE_CHECKING:
    from prudent.checkpoint.storage import CheckpointStorage

__all__ = ["SHARDS_SUFFIX", "canonical_name", "corrupted_shards", "dcp_entries", "holds_shards", "is_sharded_entry",
           "load_sharded", "missing_shards", "module_pairs", "owner_of", "save_sharded",
           "shard_digests", "sharded_objects", "shards_folder_of", "write_shards"]

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
    """``key -> (module, optimizer or None)`` for the attached sharded (FSDP2) modules and each
    optimizer of their parameters: when there are any, every rank writes its shards."""
    return module_pairs(objects, sharded_only=True)


def module_pairs(objects: dict[str, Any], sharded_only: bool = False, *,
                 saving: bool = False) -> dict[str, tuple[torch.nn.Module, Any]]:
    """``key -> (module, optimizer or None)`` for every attached model (or every sharded one)
    and each optimizer of its parameters: what DCP saves from or reads shards into.

    ``saving``: only what DCP's state-dict API takes as it is: a model with some state, and an
    optimizer that has stepped (the API would take a step of learning rate 0 to create the
    state of one that has not, which changes Adam's step count) and updates that model's
    parameters alone. The rest is saved whole, as ``state_dict()`` gives it."""
    modules = {key: obj for key, obj in objects.items()
               if isinstance(obj, torch.nn.Module) and (not sharded_only or holds_shards(obj))
               and not (saving and _stateless(obj))}
    found: dict[str, tuple[torch.nn.Module, Any]] = {k: (m, None) for k, m in modules.items()}
    for key, obj in objects.items():
        if isinstance(obj, torch.optim.Optimizer):
            owner = owner_of(obj, modules.values(), whole=saving)
            if owner is not None and not (saving and not obj.state):
                found[key] = (owner, obj)
    return found


def _stateless(module: torch.nn.Module) -> bool:
    """No parameter and no buffer: nothing for DCP (an activation, a loss module)."""
    return next(module.parameters(), None) is None and next(module.buffers(), None) is None


def dcp_entries(objects: dict[str, tuple[torch.nn.Module, Any]], folder: str
                ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors DCP writes for ``objects`` (``<key>/<name>``, references to the live ones)
    and what ``state.pt`` keeps for each key (the folder's name and the plain numbers)."""
    tensors: dict[str, torch.Tensor] = {}
    kept: dict[str, Any] = {}
    for key, (module, optimizer) in objects.items():
        state = _state_dict(module, optimizer)
        tensors.update({f"{key}/{k}": v for k, v in state.items() if isinstance(v, torch.Tensor)})
        kept[key] = {_MARK: folder,
                     "plain": {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}}
    return tensors, kept


def write_shards(storage: CheckpointStorage, folder: str, tensors: dict[str, torch.Tensor]) -> None:
    """One process writes whole (replicated) state as DCP shards: rank 0's writer thread, no
    collective (``no_dist``), into a folder emptied first (a failed earlier write's files
    would be listed in the manifest)."""
    import torch.distributed.checkpoint as dcp

    storage.delete(folder)
    _quiet_single_process()
    dcp.save(tensors, storage_writer=storage.dcp_writer(folder), no_dist=True)


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

    tensors, kept = dcp_entries(objects, folder)
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
                 storage: CheckpointStorage, group: Any, alone: bool = False) -> None:
    """Read each object's shards back (resharded to this world) and load them in place; the
    caller has checked the folder's files against the manifest (:func:`corrupted_shards`).
    ``alone``: this process reads without the other ranks (a rollback of replicated state)."""
    import torch.distributed.checkpoint as dcp

    folder = shards_folder_of(saved)
    states = {key: _state_dict(module, optimizer) for key, (module, optimizer) in objects.items()}
    tensors = {f"{key}/{k}": v for key, state in states.items() for k, v in state.items()
               if isinstance(v, torch.Tensor)}
    reader = storage.dcp_reader(folder)
    never_stepped = _never_stepped(objects, tensors, reader)
    from torch.distributed.checkpoint.api import CheckpointException

    no_dist = alone or (group is None and not _distributed())
    if no_dist:
        _quiet_single_process()
    try:
        dcp.load(tensors, storage_reader=reader,
                 process_group=None if alone else group, no_dist=no_dist)
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
        fresh = never_stepped.get(key)
        if fresh:  # their made-up state went in with the rest (the optimizer's loader checks
            _forget_state(module, optimizer, fresh)  # every field), and goes now


def _never_stepped(objects: dict[str, tuple[torch.nn.Module, Any]],
                   tensors: dict[str, torch.Tensor], reader: Any) -> dict[str, set[str]]:
    """Parameters an optimizer had no state for when it was saved (they never got a
    gradient: a frozen or unused layer), by key; their tensors are not asked of DCP. The
    state-dict API creates state for every parameter of a fresh optimizer (a step of learning
    rate 0), which the saved run never had."""
    try:
        saved = set(reader.read_metadata().state_dict_metadata)
    except Exception:  # noqa: BLE001 - unreadable: dcp.load names it
        return {}
    found: dict[str, set[str]] = {}
    for key, (_, optimizer) in objects.items():
        if optimizer is None:
            continue
        for name in [n for n in tensors if n.startswith(f"{key}/state.") and n not in saved]:
            del tensors[name]
            found.setdefault(key, set()).add(_param_of(name[len(key) + 1:]))
    return found


WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP's and torch.compile's


def canonical_name(name: str) -> str:
    """A parameter's name without the wrappers around the model (DDP, torch.compile): the
    name DCP's state-dict API gives it."""
    while name.startswith(WRAPPER_PREFIXES):
        name = name.split(".", 1)[1]
    return name


def _param_of(flat: str) -> str:
    """``state.<parameter name>.<field>`` -> the parameter's name."""
    return flat[len("state."):].rsplit(".", 1)[0]


def _forget_state(module: torch.nn.Module, optimizer: Any, names: set[str]) -> None:
    """Those parameters have no optimizer state again, as in the saved run."""
    for name, param in module.named_parameters():
        if canonical_name(name) in names:
            optimizer.state.pop(param, None)


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


def owner_of(optimizer: Any, modules: Any, whole: bool = False) -> torch.nn.Module | None:
    """The module among ``modules`` whose parameters ``optimizer`` updates (``whole``: that
    updates none outside it)."""
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        own = {id(p) for p in module.parameters()}
        if params <= own if whole else bool(params & own):
            return module
    return None


_SINGLE_PROCESS = (r"torch\.distributed is disabled, unavailable or uninitialized, assuming the "
                   r"intent is to (save|load) in a single process")


def _quiet_single_process() -> None:
    """DCP warns at every save and load in one process, which is what prudent asked for:
    not the user's concern (added once; a filter is process-wide, and the writer's thread
    cannot use ``catch_warnings``)."""
    if not any(getattr(f[1], "pattern", None) == _SINGLE_PROCESS for f in warnings.filters):
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _dtensor_type() -> Any:
    module = sys.modules.get("torch.distributed.tensor")  # not imported: nothing is a DTensor
    return getattr(module, "DTensor", None)
