from __future__ import annotations

import pytest

from prudent.errors import ConfigError
from prudent.hparams import apply_overrides, overrides_from_env, parse_set_args


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
