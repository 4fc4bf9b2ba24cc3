"""prudent's own settings: the project file ``prudent.yaml``, environment variables, flags.

The file is one section per component, each a pydantic model owned by that component and
validated before anything runs::

    store:   {home: .prudent, url: null, flush_interval_s: 0.5}
    console: {mode: auto, interval_s: 10}
    run:     {device: auto}
    profile: {interval_s: 5, steps: null, thresholds: {input_bound_pct: 20}}
    monitor: {check_every_steps: 10, rules: {stalled: {timeout_s: 10min}}}
    debug:   {enabled: false, capture: true, max_bytes: 1GB}
    cost:    {instance: aws:g5.xlarge, spot: true, budget_usd: $40, max_hours: 12}
    policy:  {allowed_instances: ['aws:g5.*'], max_usd_per_day: 200}
    tracking: {tensorboard: {logdir: runs}, mlflow: {tracking_uri: ..., experiment: ...}}

Precedence, lowest first: model defaults, ``prudent.yaml``, ``PRUDENT_*`` variables, CLI flags.
The user's hyperparameters are not here: they are ``run.config`` (see
:mod:`prudent.wiring.hparams`).
"""

from __future__ import annotations

import difflib
import os
import re
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prudent.checkpoint.settings import CheckpointSettings
from prudent.console.settings import ConsoleSettings
from prudent.cost.settings import CostSettings, PolicySettings
from prudent.debug.settings import DebugSettings
from prudent.kernel.errors import ConfigError
from prudent.kernel.run import RunSettings
from prudent.launch.spec import ENV_CONFIG, ENV_SETTINGS
from prudent.monitor.settings import MonitorSettings
from prudent.preemption.settings import PreemptionSettings
from prudent.profile.settings import ProfileSettings
from prudent.store.database import StoreSettings
from prudent.tracking.settings import TrackingSettings

__all__ = ["ENV_SETTINGS", "ProjectSettings", "RunSettings", "load_settings", "read_yaml_file"]

SETTINGS_FILE = "prudent.yaml"


class ProjectSettings(BaseModel):
    """The whole of prudent.yaml."""

    model_config = ConfigDict(extra="forbid")

    store: StoreSettings = Field(default_factory=StoreSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    profile: ProfileSettings = Field(default_factory=ProfileSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    preemption: PreemptionSettings = Field(default_factory=PreemptionSettings)
    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    debug: DebugSettings = Field(default_factory=DebugSettings)
    cost: CostSettings = Field(default_factory=CostSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)


def load_settings(path: str | os.PathLike[str] | None = None,
                  environ: Mapping[str, str] | None = None,
                  overrides: Mapping[tuple[str, str], Any] | None = None) -> ProjectSettings:
    """Read, merge and validate settings; a problem raises :class:`ConfigError` naming the fix.

    ``path`` defaults to ``$PRUDENT_CONFIG``, then ``./prudent.yaml`` if it exists.
    """
    environ = os.environ if environ is None else environ
    source, data = _read_file(path or environ.get(ENV_CONFIG) or None)
    sources: dict[tuple[str, ...], str] = {}
    for var, (section, key) in ENV_SETTINGS.items():
        if environ.get(var):
            data.setdefault(section, {})[key] = environ[var]
            sources[(section, key)] = var
    for (section, key), value in (overrides or {}).items():
        if value is not None:
            data.setdefault(section, {})[key] = value
            sources[(section, key)] = "command line"
    try:
        return ProjectSettings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source or "settings", sources)) from None


def _read_file(path: str | os.PathLike[str] | None) -> tuple[str | None, dict[str, Any]]:
    if path is None:
        if not Path(SETTINGS_FILE).is_file():
            return None, {}
        path = SETTINGS_FILE
    data = read_yaml_file(path, "settings file")
    if data is None:
        return str(path), {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"{path}: expected sections of key: value pairs, e.g. 'store: "
                          f"{{home: .prudent}}', got {reprlib.repr(data)}")
    return str(path), {k: dict(v) for k, v in data.items()}


class _Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2's booleans: only true and false. YAML 1.1 (PyYAML's default) also reads on,
    off, yes and no as booleans, so ``every: off`` or ``mode: off``, as the docs write them,
    reached the settings as False; a boolean setting still takes them (pydantic reads the
    strings 'on', 'off', 'yes' and 'no')."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def read_yaml_file(path: str | os.PathLike[str], what: str) -> Any:
    """A YAML file's content; an unreadable file or bad YAML is a :class:`ConfigError` naming
    the file (and the line)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    try:
        return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None


def describe_validation_error(exc: ValidationError, source: str,
                              sources: Mapping[tuple[str, ...], str] | None = None) -> str:
    """pydantic's errors as one line: where from, the key, the value, what is allowed."""
    sources = sources or {}
    return "; ".join(_describe_one(err, sources.get(tuple(map(str, err["loc"])), source))
                     for err in exc.errors())


def _describe_one(err: Mapping[str, Any], source: str) -> str:
    loc = [str(part) for part in err["loc"]]
    key = ".".join(loc)
    if err["type"] == "extra_forbidden":
        names = _allowed_keys(loc[:-1])
        what = "section" if len(loc) == 1 else "key"
        close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
        hint = f" (did you mean {'.'.join([*loc[:-1], close[0]])!r}?)" if close else ""
        return f"{source}: unknown {what} {key!r}{hint}; allowed: {', '.join(names)}"
    value = err.get("input")
    reason = str(err["msg"]).removeprefix("Value error, ")
    return f"{source}: {key}={value!r} is invalid: {reason}"


def _allowed_keys(parent: list[str]) -> list[str]:
    model: type[BaseModel] = ProjectSettings
    for part in parent:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)

