"""The user's hyperparameters (``run.config``): the ``init`` dict plus overrides.

Overrides come from ``prudent run --set key=value`` or the tuner and reach the training
process through the launch spec (``launch/spec.py``). A key the script's config does not have is
an error: a typo must never silently train with the default. ``run.config`` itself is a
:class:`TrackedConfig`: it notes which keys the script read, so that a key set from outside
that the script never reads is named too (:mod:`prudent.watches.unread_config`).
"""

from __future__ import annotations

import copy
import difflib
import json
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

import yaml

from prudent.kernel.errors import ConfigError
from prudent.launch.spec import ENV_OVERRIDES, overrides_from_env

__all__ = ["ENV_OVERRIDES", "TrackedConfig", "apply_overrides", "overrides_from_env",
           "parse_set_args", "untracked"]


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
            close = difflib.get_close_matches(part, list(node) if isinstance(node, dict) else [],
                                              n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"--set {key}: unknown key {part!r} in {where}{hint}; known keys: {known}. "
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


class TrackedConfig(dict[str, Any]):
    """``run.config``: a dict that notes which of its keys the script read.

    A read is ``cfg[key]``, ``cfg.get(key)``, ``pop`` and ``setdefault``; ``items()``,
    ``values()``, ``copy()``, ``copy.copy``/``deepcopy``, pickling and ``json.dumps`` read every
    key. ``__iter__`` is overridden, unchanged, for one reason: CPython copies a dict whose type
    keeps dict's own ``__iter__`` through its internals (``dict_merge``), without calling
    ``__getitem__``; with it overridden, ``dict.update(cfg)``, ``dict(cfg)``, ``{**cfg}`` and
    ``f(**cfg)`` go through ``keys()`` and ``__getitem__``, so nanoGPT's
    ``globals().update(run.config)`` reads every key. The keys alone (``for k in cfg``,
    ``k in cfg``, ``print(cfg)``) read nothing. A nested dict is tracked under dotted keys
    (``model.hidden``), as ``--set`` names them. Pickled, it is an ``OrderedDict`` (a class
    ``torch.load(weights_only=True)`` accepts).
    """

    __slots__ = ("_prefix", "_read")

    def __init__(self, data: Mapping[str, Any] | None = None, *, prefix: str = "",
                 read: set[str] | None = None) -> None:
        super().__init__()
        self._prefix = prefix
        self._read: set[str] = set() if read is None else read
        for key, value in (data or {}).items():
            if type(value) is dict:
                value = TrackedConfig(value, prefix=f"{prefix}{key}.", read=self._read)
            dict.__setitem__(self, key, value)

    def was_read(self, key: str) -> bool:
        """True once the script read ``key`` (dotted for a nested one: ``model.hidden``)."""
        return key in self._read

    def untracked(self) -> dict[str, Any]:
        """A plain copy for prudent's own use (the record, a failure bundle): not a read."""
        return {k: v.untracked() if isinstance(v, TrackedConfig) else v
                for k, v in dict.items(self)}

    def _mark(self, key: Any) -> None:
        self._read.add(f"{self._prefix}{key}" if self._prefix else key)

    def _mark_all(self, nested: bool = False) -> None:
        for key, value in dict.items(self):
            self._mark(key)
            if nested and isinstance(value, TrackedConfig):
                value._mark_all(nested)

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        self._mark(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            self._mark(key)
        return dict.get(self, key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        if dict.__contains__(self, key):
            self._mark(key)
        return dict.pop(self, key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            self._mark(key)
        return dict.setdefault(self, key, default)

    def __iter__(self) -> Iterator[Any]:  # see the class docstring: not a read
        return dict.__iter__(self)

    def items(self) -> Any:
        self._mark_all()
        return dict.items(self)

    def values(self) -> Any:
        self._mark_all()
        return dict.values(self)

    def copy(self) -> dict[str, Any]:
        self._mark_all()
        return dict(dict.items(self))

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        self._mark_all(nested=True)
        return copy.deepcopy(self.untracked(), memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._mark_all()
        return OrderedDict, (), None, None, iter(dict.items(self))


def untracked(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as a plain dict, without counting as the script's read of it."""
    return config.untracked() if isinstance(config, TrackedConfig) else dict(config)


# yaml.safe_dump(run.config) writes a mapping, as it did when run.config was a plain dict (a
# dict subclass is otherwise unknown to the safe dumper, and tagged as a Python object by the
# full one)
for _representer in (yaml.representer.SafeRepresenter, yaml.representer.Representer):
    _representer.add_representer(TrackedConfig, yaml.representer.SafeRepresenter.represent_dict)
