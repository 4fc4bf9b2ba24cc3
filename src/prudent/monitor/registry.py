"""The rules prudent knows by name: the built-in ones and those a user registers.

A rule is a :class:`~prudent.monitor.base.Rule` subclass, or a function turned into one::

    from prudent.monitor import Finding, rule

    @rule("loss_above", threshold=5.0, action="alert")
    def loss_above(window, settings):
        for step, loss in window.losses():
            if loss is not None and loss > settings.threshold:
                return Finding(step, loss, settings.threshold,
                               f"loss {loss:.3g} at step {step} is above {settings.threshold}")
        return None

Register before ``prudent.init`` (the monitor is built then). ``prudent.yaml`` can tune a
registered rule under ``monitor.rules.<name>``; ``prudent run`` validates that file before it
starts the script, so list the module that registers the rule in ``monitor.plugins``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field, ValidationError, create_model

from prudent.kernel.errors import ConfigError
from prudent.monitor.base import Finding, Rule, RuleSettings, Window

__all__ = ["RULES", "import_plugins", "register_rule", "rule", "unregister_rule"]

RULES: dict[str, type[Rule]] = {}

CheckFunction = Callable[[Window, Any], "Finding | None"]


def register_rule(cls: type[Rule], *, replace: bool = False) -> type[Rule]:
    """Make ``cls`` known under ``cls.name`` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Rule)) or cls.name == Rule.name:
        raise ConfigError(f"{cls!r} is not a rule: subclass prudent.monitor.Rule and set a name")
    if not cls.name.isidentifier():
        raise ConfigError(f"rule name {cls.name!r} is invalid: use letters, digits and '_' "
                          "(it is a key in prudent.yaml and part of the stop reason)")
    try:
        cls.Settings()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}={e.get('input')!r}: {e['msg']}"
                             for e in exc.errors())
        raise ConfigError(f"rule {cls.name!r} has invalid default settings: {problems}") from None
    if cls.name in RULES and RULES[cls.name] is not cls and not replace:
        raise ConfigError(f"a rule named {cls.name!r} is already registered "
                          f"({RULES[cls.name].__qualname__}): pick another name or pass replace=True")
    RULES[cls.name] = cls
    return cls


def unregister_rule(name: str) -> None:
    RULES.pop(name, None)


def rule(name: str, *, settings: type[RuleSettings] | None = None,
         **defaults: Any) -> Callable[[CheckFunction], type[Rule]]:
    """Register ``fn(window, settings) -> Finding | None`` as a stateless rule named ``name``.

    Keyword arguments are the rule's own settings with their defaults (their types come from
    the defaults, so ``prudent.yaml`` is validated against them), plus any common field such
    as ``action="alert"``; or pass a full ``settings`` model.
    """
    model = settings or _settings_model(name, defaults)

    def decorate(fn: CheckFunction) -> type[Rule]:
        cls = type(f"{name}_rule", (_FunctionRule,), {
            "name": name, "Settings": model, "fn": staticmethod(fn), "__doc__": fn.__doc__})
        return register_rule(cls)

    return decorate


class _FunctionRule(Rule):
    """A stateless rule around a function; the base enforces ``warmup_steps`` for it."""

    fn: ClassVar[CheckFunction]

    def check(self, window: Window) -> Finding | None:
        finding = type(self).fn(window, self.settings)
        return finding if finding is not None and self.active_at(finding.step) else None


def _settings_model(name: str, defaults: dict[str, Any]) -> type[RuleSettings]:
    fields: dict[str, Any] = {}
    for key, value in defaults.items():
        if key in RuleSettings.model_fields:
            base = RuleSettings.model_fields[key]
            fields[key] = (base.annotation, Field(value, description=base.description,
                                                  validate_default=True))
        else:
            fields[key] = (type(value), Field(value, description=f"{key} of rule {name}"))
    return create_model(f"{name}_settings", __base__=RuleSettings, **fields)


def import_plugins(modules: list[str]) -> None:
    """Import the modules that register user rules (the project folder is importable)."""
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(f"cannot import rule plugin {module!r}: {exc}") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
