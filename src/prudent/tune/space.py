"""The search space: a YAML file of named parameters, validated before anything runs.

::

    lr:        {type: float, low: 1.0e-4, high: 1.0, log: true}
    hidden:    {type: int, low: 16, high: 256, log: true}
    layers:    {type: int, low: 1, high: 4, step: 1}
    optimizer: {type: categorical, choices: [adam, sgd]}
    momentum:  {type: float, low: 0.5, high: 0.99, when: {optimizer: sgd}}

A parameter with ``when`` is sampled only when every named parameter has the given value (or
one of a list of values); otherwise the script keeps its own default. Every error names the
parameter, the value and the fix, and is raised before a study is opened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prudent.kernel.errors import ConfigError
from prudent.wiring.config import read_yaml_file

if TYPE_CHECKING:
    import optuna

__all__ = ["Param", "SearchSpace", "load_space"]

_TYPES = ("float", "int", "categorical")
_KEYS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"},
         "categorical": {"choices"}}


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its distribution and the condition under which it is sampled."""

    name: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def active(self, chosen: Mapping[str, Any]) -> bool:
        return all(name in chosen and chosen[name] in values for name, values in self.when.items())

    def suggest(self, trial: optuna.trial.BaseTrial) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),  # type: ignore[arg-type]
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high),  # type: ignore[arg-type]
                                   step=self.step, log=self.log)

    def contains(self, value: Any) -> bool:
        if self.type == "categorical":
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return self.low <= value <= self.high  # type: ignore[operator]

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "categorical":
            out["choices"] = list(self.choices)
        else:
            out.update(low=self.low, high=self.high)
            if self.log:
                out["log"] = True
            if self.step is not None:
                out["step"] = self.step
        if self.when:
            out["when"] = {k: list(v) for k, v in self.when.items()}
        return out


@dataclass(frozen=True)
class SearchSpace:
    """Parameters in file order (a condition may only name a parameter defined above it)."""

    params: tuple[Param, ...]

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]:
        """Sample the active parameters, in order, define-by-run."""
        chosen: dict[str, Any] = {}
        for param in self.params:
            if param.active(chosen):
                chosen[param.name] = param.suggest(trial)
        return chosen

    def as_dict(self) -> dict[str, Any]:
        return {p.name: p.as_dict() for p in self.params}

    def fitting(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The values of ``config`` that are valid points of this space (a warm start)."""
        return {p.name: config[p.name] for p in self.params
                if p.name in config and p.contains(config[p.name])}

    def check_config(self, config: Mapping[str, Any], where: str) -> dict[str, Any]:
        """A known-good configuration (``--enqueue``) restricted to the space, checked."""
        names = {p.name for p in self.params}
        unknown = sorted(set(config) - names)
        if unknown:
            raise ConfigError(f"{where}: {', '.join(unknown)} not in the search space "
                              f"(parameters: {', '.join(sorted(names))})")
        return dict(config)


def load_space(source: str | Path | Mapping[str, Any]) -> SearchSpace:
    """Read and validate a space from a YAML file path or an already parsed mapping."""
    where = "search space"
    if not isinstance(source, Mapping):
        where = str(source)
        data = _read(Path(source))
    else:
        data = dict(source)
    if not data:
        raise ConfigError(f"{where}: the search space is empty; give at least one parameter, "
                          "e.g. lr: {type: float, low: 1.0e-4, high: 1.0, log: true}")
    params: list[Param] = []
    for name, spec in data.items():
        params.append(_param(str(name), spec, where, {p.name: p for p in params}))
    return SearchSpace(tuple(params))


def _read(path: Path) -> dict[str, Any]:
    data = read_yaml_file(path, "search space")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected 'name: {{type: ..., ...}}' per parameter, "
                          f"got {type(data).__name__}")
    return data


def _param(name: str, spec: Any, where: str, earlier: Mapping[str, Param]) -> Param:
    at = f"{where}: parameter {name!r}"
    if not isinstance(spec, dict):
        raise ConfigError(f"{at}: expected a mapping like {{type: float, low: 0.1, high: 1}}, "
                          f"got {spec!r}")
    spec = dict(spec)
    kind = spec.pop("type", None)
    if kind not in _TYPES:
        raise ConfigError(f"{at}: unknown type {kind!r}; use one of: {', '.join(_TYPES)}")
    when = _when(spec.pop("when", None), at, earlier)
    extra = sorted(set(spec) - _KEYS[kind])
    if extra:
        raise ConfigError(f"{at}: unknown key(s) {', '.join(extra)} for type {kind}; "
                          f"allowed: {', '.join(sorted(_KEYS[kind] | {'type', 'when'}))}")
    if kind == "categorical":
        return _categorical(name, spec, at, when)
    return _numeric(name, kind, spec, at, when)


def _categorical(name: str, spec: dict[str, Any], at: str,
                 when: dict[str, tuple[Any, ...]]) -> Param:
    choices = spec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{at}: choices must be a non-empty list, got {choices!r}; "
                          "e.g. choices: [adam, sgd]")
    bad = [c for c in choices if not (c is None or isinstance(c, (bool, int, float, str)))]
    if bad:
        raise ConfigError(f"{at}: choices must be numbers, strings, booleans or null, "
                          f"got {bad[0]!r}")
    if len(set(map(repr, choices))) != len(choices):
        raise ConfigError(f"{at}: choices {choices!r} repeat a value")
    return Param(name, "categorical", choices=tuple(choices), when=when)


def _numeric(name: str, kind: str, spec: dict[str, Any], at: str,
             when: dict[str, tuple[Any, ...]]) -> Param:
    low, high = _yaml_float(spec.get("low")), _yaml_float(spec.get("high"))
    for key, value in (("low", low), ("high", high)):
        if not _is_number(value, kind):
            need = "an integer" if kind == "int" else "a number"
            raise ConfigError(f"{at}: {key} must be {need}, got {value!r}")
    if low > high:  # type: ignore[operator]
        raise ConfigError(f"{at}: low={low} > high={high}; swap them")
    log, step = spec.get("log", False), _yaml_float(spec.get("step"))
    if not isinstance(log, bool):
        raise ConfigError(f"{at}: log must be true or false, got {log!r}")
    if log and low <= 0:  # type: ignore[operator]
        raise ConfigError(f"{at}: log: true needs low > 0, got low={low}")
    if step is not None:
        if not _is_number(step, kind) or step <= 0:
            raise ConfigError(f"{at}: step must be a positive {kind}, got {step!r}")
        if log:
            raise ConfigError(f"{at}: step and log: true cannot be combined (Optuna samples "
                              "either on a grid or on a log scale); drop one")
    cast = int if kind == "int" else float
    return Param(name, kind, low=cast(low), high=cast(high), log=log,
                 step=None if step is None else cast(step), when=when)


def _yaml_float(value: Any) -> Any:
    """YAML 1.1 reads ``1.0e3`` (no exponent sign) as a string: take it as the number meant."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _is_number(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, (int, float)) and math.isfinite(value)


def _when(raw: Any, at: str, earlier: Mapping[str, Param]) -> dict[str, tuple[Any, ...]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{at}: when must map a parameter to its value(s), "
                          f"e.g. when: {{optimizer: sgd}}, got {raw!r}")
    out: dict[str, tuple[Any, ...]] = {}
    for other, values in raw.items():
        if other not in earlier:
            raise ConfigError(f"{at}: when names {other!r}, which is not a parameter defined "
                              f"above it (defined: {', '.join(earlier) or 'none'})")
        values = tuple(values) if isinstance(values, list) else (values,)
        parent = earlier[other]
        if parent.type == "categorical" and any(v not in parent.choices for v in values):
            raise ConfigError(f"{at}: when {other}={list(values)} but {other}'s choices are "
                              f"{list(parent.choices)}")
        out[str(other)] = values
    return out
