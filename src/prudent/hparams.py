"""The user's hyperparameters (``run.config``): the ``init`` dict plus overrides.

Overrides come from ``prudent run --set key=value`` or the tuner and reach the training
process through the launch spec (``launch.py``). A key the script's config does not have is
an error: a typo must never silently train with the default.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import yaml

from prudent.errors import ConfigError
from prudent.launch import ENV_OVERRIDES, overrides_from_env

__all__ = ["ENV_OVERRIDES", "apply_overrides", "overrides_from_env", "parse_set_args"]


def parse_set_args(items: Iterable[str]) -> dict[str, Any]:
    """``["lr=1e-3", "model.hidden=64"]`` -> ``{"lr": 0.001, "model.hidden": 64}``.

    Values are YAML scalars (``true``, ``3``, ``[1, 2]``, ``'text'``).
    """
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r} has no key=value: write it as --set lr=0.001")
        try:
            parsed[key] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise ConfigError(f"--set {item!r}: value is not valid YAML ({problem})") from None
    return parsed


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any],
                    settings_sections: Collection[str] = ()) -> dict[str, Any]:
    """A copy of ``config`` with ``overrides`` applied; dotted keys reach into nested dicts.
    ``settings_sections``: prudent.yaml's sections (``monitor``, ``checkpoint``, ...), named in
    the error when a key the config lacks starts with one."""
    result = copy.deepcopy(dict(config))
    for key, value in overrides.items():
        section = key.split(".", 1)[0]
        if section not in result and section in settings_sections:
            parts = key.split(".")
            yaml_text = (f"{section}: " + "".join(f"{{{part}: " for part in parts[1:]) + "..."
                         + "}" * (len(parts) - 1))
            raise ConfigError(
                f"--set {key}: {section!r} is a section of prudent.yaml, not a key of the run's "
                f"config: --set changes hyperparameters only. Put it in prudent.yaml instead: "
                f"{yaml_text}")
        parent, leaf = _locate(result, key)
        parent[leaf] = _coerce(key, parent[leaf], value)
    return result


def _locate(config: dict[str, Any], key: str) -> tuple[dict[str, Any], str]:
    node: Any = config
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            known = ", ".join(sorted(_flat_keys(config))) or "(the config is empty)"
            where = ".".join(parts[:depth]) or "config"
            raise ConfigError(
                f"--set {key}: unknown key {part!r} in {where}; known keys: {known}. "
                "Fix the spelling, or add the key to the config passed to prudent.init"
            )
        if depth == len(parts) - 1:
            return node, part
        node = node[part]
    raise AssertionError("unreachable")


def _flat_keys(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        keys.append(prefix + str(key))
        if isinstance(value, Mapping):
            keys.extend(_flat_keys(value, f"{prefix}{key}."))
    return keys


def _coerce(key: str, default: Any, value: Any) -> Any:
    """Give ``value`` the type of the default, or say why it cannot have it."""
    if default is None or value is None or type(value) is type(default):
        return value
    if isinstance(default, bool) or isinstance(value, bool):
        return _mismatch(key, default, value)
    if isinstance(default, float) and isinstance(value, (int, str)):
        try:
            return float(value)  # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            return _mismatch(key, default, value)
    if isinstance(default, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(default, str) and isinstance(value, (int, float)):
        return str(value)
    return _mismatch(key, default, value)


def _mismatch(key: str, default: Any, value: Any) -> Any:
    raise ConfigError(
        f"--set {key}={json.dumps(value) if not isinstance(value, str) else value}: "
        f"expected {type(default).__name__} like the default {default!r}, "
        f"got {type(value).__name__} {value!r}"
    )
