"""A checkpoint resumes under another parallelism.

A job is often moved: trained on one GPU and scaled to eight, its DDP run resumed under FSDP2
when the model outgrows a GPU, or a crash of a DDP job debugged on a laptop. A checkpoint holds
a model's state in one of two forms: whole (``state.pt``, written by rank 0 for one process and
DDP) or in shards (DCP, for FSDP2; ``prudent.checkpoint.sharded``). Either loads into a model
and optimizer of any form, through ``torch.distributed.checkpoint.state_dict``, whose names are
a parameter's own (no ``module.`` of DDP, no ``_orig_mod.`` of ``torch.compile``):

- whole into whole: ``load_state_dict``, with the names translated when a wrapper differs
  (DDP's state loaded into the bare module, a compiled module's into an uncompiled one);
- whole into shards: ``set_model_state_dict``/``set_optimizer_state_dict`` with full tensors,
  each rank keeping its shard (the optimizer's state, saved keyed by parameter position, is
  renamed by parameter);
- shards into whole: DCP reads the shards into the whole tensors (``load_sharded``).
"""

from __future__ import annotations

from typing import Any

import torch

from prudent.checkpoint.sharded import canonical_name, holds_shards, owner_of
from prudent.kernel.errors import ConfigError

__all__ = ["canonical_name", "needs_translation", "restore_whole_module",
           "restore_whole_optimizer", "sharded_owner"]


def needs_translation(module: torch.nn.Module, saved: Any) -> bool:
    """The module cannot take ``saved`` (a whole state dict) with its own ``load_state_dict``:
    it holds shards, or its names differ from the saved ones by a wrapper."""
    if not isinstance(saved, dict):
        return False
    return holds_shards(module) or set(saved) != set(module.state_dict())


def restore_whole_module(key: str, module: torch.nn.Module, saved: dict[str, Any]) -> None:
    """Load a whole state dict into ``module`` whatever wraps or shards it."""
    state = {canonical_name(name): value for name, value in saved.items()}  # a copy: DCP
    # replaces the values it is given by the shards it made of them
    try:
        if holds_shards(module):
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True,
                                                                          strict=True))
        else:  # its own names, told apart from the saved ones by their wrappers alone
            own = {canonical_name(name): name for name in module.state_dict()}
            module.load_state_dict({own.get(name, name): value for name, value in state.items()})
    except (RuntimeError, KeyError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"the checkpoint's {key} does not fit the attached {key} ({reason}): "
                          "resume with the model the checkpoint was saved from") from None


def sharded_owner(optimizer: Any, objects: dict[str, Any]) -> torch.nn.Module | None:
    """The attached sharded (FSDP2) module whose parameters ``optimizer`` updates, if any."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return owner_of(optimizer, [obj for obj in objects.values()
                                if isinstance(obj, torch.nn.Module) and holds_shards(obj)])


def restore_whole_optimizer(key: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            saved: dict[str, Any]) -> None:
    """Load an optimizer's state saved whole (``optimizer.state_dict()``: parameters by position)
    into ``optimizer`` over the sharded ``module``: positions become parameter names, the
    state's full tensors become each rank's shard."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    names = {id(param): canonical_name(name) for name, param in module.named_parameters()}
    params = [param for group in optimizer.param_groups for param in group["params"]]
    positions = [index for group in saved["param_groups"] for index in group["params"]]
    if len(params) != len(positions) or any(id(param) not in names for param in params):
        raise ConfigError(f"the checkpoint's {key} updated {len(positions)} parameters, the "
                          f"attached one {len(params)} (or some outside the model): resume with "
                          "the optimizer the checkpoint was saved from")
    name_of = {index: names[id(param)] for index, param in zip(positions, params, strict=True)}
    state = {"state": {name_of[index]: dict(values) for index, values in saved["state"].items()},
             "param_groups": [{**group, "params": [name_of[i] for i in group["params"]]}
                              for group in saved["param_groups"]]}
    set_optimizer_state_dict(module, optimizer, state,
                             options=StateDictOptions(full_state_dict=True))
