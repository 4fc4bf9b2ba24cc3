from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from prudent.kernel.errors import ConfigError
from prudent.tune.space import load_space

SPACE = """
lr:        {type: float, low: 1.0e-4, high: 1.0e3, log: true}
hidden:    {type: int, low: 16, high: 256, log: true}
layers:    {type: int, low: 1, high: 4, step: 1}
optimizer: {type: categorical, choices: [adam, sgd]}
momentum:  {type: float, low: 0.5, high: 0.99, when: {optimizer: sgd}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_space_file_reads_every_kind_and_yaml_exponents_without_sign(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, SPACE))
    by_name = {p.name: p for p in space.params}
    assert by_name["lr"].high == 1000.0 and by_name["lr"].log
    assert by_name["layers"].step == 1 and by_name["optimizer"].choices == ("adam", "sgd")
    assert by_name["momentum"].when == {"optimizer": ("sgd",)}
    assert load_space(space.as_dict()) == space  # round trip through the study's user attrs


def test_conditional_parameter_is_sampled_only_when_its_condition_holds(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, SPACE))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []
    for _ in range(20):
        params = space.suggest(study.ask())
        assert ("momentum" in params) == (params["optimizer"] == "sgd")
        assert 1e-4 <= params["lr"] <= 1e3 and 16 <= params["hidden"] <= 256
        seen.append(params["optimizer"])
    assert set(seen) == {"adam", "sgd"}


@pytest.mark.parametrize(("text", "expected"), [
    ("lr: {type: floot, low: 0.1, high: 1}", "parameter 'lr': unknown type 'floot'; use one of"),
    ("lr: {type: float, low: 1.0, high: 0.1}", "parameter 'lr': low=1.0 > high=0.1; swap them"),
    ("opt: {type: categorical, choices: []}", "parameter 'opt': choices must be a non-empty list"),
    ("n: {type: int, low: 1.5, high: 4}", "parameter 'n': low must be an integer, got 1.5"),
    ("lr: {type: float, low: 0, high: 1, log: true}", "parameter 'lr': log: true needs low > 0"),
    ("lr: {type: float, low: 0.1, high: 1, lg: true}", "parameter 'lr': unknown key(s) lg"),
    ("m: {type: float, low: 0.1, high: 1, when: {opt: sgd}}",
     "parameter 'm': when names 'opt', which is not a parameter defined above it"),
    ("opt: {type: categorical, choices: [adam]}\nm: {type: float, low: 0.1, high: 1, when: {opt: sgd}}",
     "when opt=['sgd'] but opt's choices are ['adam']"),
    ("", "the search space is empty"),
    ("lr: [1, 2]", "parameter 'lr': expected a mapping"),
])
def test_bad_space_is_refused_with_an_error_naming_the_parameter(
        tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_space(_write(tmp_path, text))
    assert expected in str(info.value)
    assert str(tmp_path / "space.yaml") in str(info.value) or "empty" in expected


def test_enqueued_configuration_must_name_parameters_of_the_space(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, SPACE))
    with pytest.raises(ConfigError, match="--enqueue #1: lrr not in the search space"):
        space.check_config({"lrr": 0.1}, "--enqueue #1")
