"""A model's state saved whole under one wrapper loads into another (DDP's ``module.``,
torch.compile's ``_orig_mod.``), and a model that does not fit is named."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from prudent.checkpoint.portable import canonical_name, needs_translation, restore_whole_module
from prudent.kernel.errors import ConfigError


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


class Wrapper(nn.Module):
    """Names its model ``module`` like DDP does (DDP itself needs a process group)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.module = inner


def test_wrapper_prefixes_are_dropped_from_the_front_only() -> None:
    assert canonical_name("module._orig_mod.0.weight") == "0.weight"
    assert canonical_name("encoder.module.weight") == "encoder.module.weight"


def test_ddp_state_loads_into_the_bare_model_and_back() -> None:
    saved = Wrapper(model(0)).state_dict()
    assert list(saved)[0] == "module.0.weight"
    bare = model(1)
    assert needs_translation(bare, saved)
    restore_whole_module("model", bare, saved)
    assert all(torch.equal(bare.state_dict()[k], saved[f"module.{k}"]) for k in bare.state_dict())
    assert "module.0.weight" in saved  # the caller's dict is left as it was

    wrapped = Wrapper(model(2))
    restore_whole_module("model", wrapped, model(0).state_dict())
    assert torch.equal(wrapped.module[0].weight, model(0)[0].weight)


def test_a_compiled_models_state_loads_into_the_uncompiled_one() -> None:
    with warnings.catch_warnings():  # torch's own import of torch.jit, on the first compile
        warnings.simplefilter("ignore", DeprecationWarning)
        compiled = torch.compile(model(0))
    saved = compiled.state_dict()
    assert list(saved)[0].startswith("_orig_mod.")
    bare = model(1)
    restore_whole_module("model", bare, saved)
    assert torch.equal(bare[2].bias, model(0)[2].bias)


def test_same_names_need_no_translation() -> None:
    assert not needs_translation(model(0), model(1).state_dict())


def test_a_state_that_does_not_fit_is_named() -> None:
    other = nn.Sequential(nn.Linear(4, 8))
    with pytest.raises(ConfigError, match="the checkpoint's model does not fit the attached model"):
        restore_whole_module("model", other, Wrapper(model(0)).state_dict())
