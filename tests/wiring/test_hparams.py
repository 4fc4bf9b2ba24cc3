from __future__ import annotations

import copy
import json
import pickle
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from prudent.kernel.errors import ConfigError
from prudent.wiring.hparams import (
    TrackedConfig,
    apply_overrides,
    overrides_from_env,
    parse_set_args,
)


def test_set_values_are_yaml_scalars() -> None:
    parsed = parse_set_args(["lr=0.01", "epochs=3", "amp=true", "name=resnet", "sizes=[1, 2]",
                             "note="])
    assert parsed == {"lr": 0.01, "epochs": 3, "amp": True, "name": "resnet", "sizes": [1, 2],
                      "note": ""}


def test_set_without_equals_names_the_item_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"--set 'lr' has no key=value: write it as --set lr="):
        parse_set_args(["lr"])


def test_unknown_key_lists_known_keys() -> None:
    with pytest.raises(ConfigError) as err:
        apply_overrides({"lr": 0.1, "model": {"hidden": 8}}, {"lrr": 0.2})
    assert "unknown key 'lrr'" in str(err.value)
    assert "known keys: lr, model, model.hidden" in str(err.value)


def test_a_settings_section_passed_to_set_says_where_it_goes_instead() -> None:
    sections = ("monitor", "checkpoint")
    with pytest.raises(ConfigError) as info:
        apply_overrides({"lr": 0.1}, {"monitor.rules.loss_spike.min_sigmas": 2}, sections)
    assert str(info.value) == (
        "--set monitor.rules.loss_spike.min_sigmas: 'monitor' is a section of prudent.yaml, not "
        "a key of the run's config: --set changes hyperparameters only. Put it in prudent.yaml "
        "instead: monitor: {rules: {loss_spike: {min_sigmas: ...}}}")
    # a config of the user's own with such a key is the user's: overridden as any other
    assert apply_overrides({"monitor": {"every": 1}}, {"monitor.every": 2}, sections) == {
        "monitor": {"every": 2}}


def test_dotted_keys_reach_nested_values_without_touching_the_original() -> None:
    original = {"model": {"hidden": 8, "act": "relu"}}
    assert apply_overrides(original, {"model.hidden": 16}) == {"model": {"hidden": 16, "act": "relu"}}
    assert original["model"]["hidden"] == 8


@pytest.mark.parametrize(("default", "given", "expected"), [
    (0.1, "1e-3", 0.001),  # YAML 1.1 reads 1e-3 as a string
    (0.1, 1, 1.0), (3, 4.0, 4), ("adam", 5, "5"), (None, "x", "x"), ([1], [2, 3], [2, 3]),
])
def test_values_take_the_type_of_the_default(default: object, given: object, expected: object) -> None:
    result = apply_overrides({"k": default}, {"k": given})["k"]
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(("default", "given"), [(True, "yes please"), (3, 2.5), (0.1, "fast"),
                                                (1, True), ({"a": 1}, 3)])
def test_wrong_types_are_errors_naming_default_and_value(default: object, given: object) -> None:
    with pytest.raises(ConfigError, match="expected .* like the default"):
        apply_overrides({"k": default}, {"k": given})


def test_overrides_from_env_rejects_garbage() -> None:
    assert overrides_from_env({}) == {}
    assert overrides_from_env({"PRUDENT_SET": '{"a": 1}'}) == {"a": 1}
    with pytest.raises(ConfigError, match="PRUDENT_SET"):
        overrides_from_env({"PRUDENT_SET": "[1]"})


def _tracked() -> TrackedConfig:
    return TrackedConfig({"lr": 0.1, "epochs": 2, "model": {"hidden": 8, "act": "relu"}})


def _read(config: TrackedConfig) -> list[str]:
    return sorted(k for k in ("lr", "epochs", "model", "model.hidden", "model.act")
                  if config.was_read(k))


def test_run_config_notes_each_key_the_script_reads_by_its_dotted_name() -> None:
    config = _tracked()
    assert config["lr"] == 0.1 and config.get("epochs") == 2 and config.get("nope") is None
    assert config["model"]["hidden"] == 8
    assert _read(config) == ["epochs", "lr", "model", "model.hidden"]


def test_the_keys_alone_are_not_a_read() -> None:
    config = _tracked()
    assert list(config) == ["lr", "epochs", "model"] and "lr" in config and len(config) == 3
    assert config == {"lr": 0.1, "epochs": 2, "model": {"hidden": 8, "act": "relu"}}
    assert repr(config) == "{'lr': 0.1, 'epochs': 2, 'model': {'hidden': 8, 'act': 'relu'}}"
    assert config.untracked() == config and _read(config) == []


@pytest.mark.parametrize("use", [
    lambda c: exec("globals().update(config)", {"config": c}),  # nanoGPT's configurator line
    lambda c: {}.update(c), dict, lambda c: {**c}, lambda c: (lambda **kw: kw)(**c),
    lambda c: [v for _, v in c.items()], lambda c: list(c.values()), lambda c: c.copy(),
    lambda c: json.dumps(c),
], ids=["globals-update", "dict-update", "dict", "unpack", "kwargs", "items", "values", "copy",
        "json"])
def test_taking_the_whole_config_reads_every_key(use: Callable[[TrackedConfig], Any]) -> None:
    """CPython copies a dict subclass that keeps dict's own __iter__ without __getitem__:
    TrackedConfig overrides __iter__ so that these go through keys() and __getitem__."""
    config = _tracked()
    use(config)
    assert {"lr", "epochs", "model"} <= set(_read(config))


def test_globals_update_brings_the_values_into_the_script() -> None:
    script: dict[str, Any] = {"config": _tracked(), "lr": 1e-3}
    exec("globals().update(config)", script)
    assert script["lr"] == 0.1 and script["model"]["hidden"] == 8


def test_run_config_saved_by_the_script_loads_as_a_plain_mapping(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    config = _tracked()
    torch.save({"config": config}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)["config"]  # no prudent class
    assert loaded == config and type(loaded) is OrderedDict
    assert yaml.safe_load(yaml.safe_dump(config)) == config
    assert type(copy.deepcopy(config)) is dict and pickle.loads(pickle.dumps(config)) == config
    assert _read(config) == ["epochs", "lr", "model", "model.act", "model.hidden"]
