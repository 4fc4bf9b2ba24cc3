"""What a prudent parent hands the child it starts: one :class:`LaunchSpec`.

``prudent run``, ``tune``, ``preflight`` and ``replay`` start the user's script (or a tuning
worker) as a child process; the child learns its run id, name, ``--set`` overrides, settings,
trial, replay and smoke-test details from its environment. Every variable that crosses that
boundary is named here, written by :meth:`LaunchSpec.to_env` and read by
:meth:`LaunchSpec.from_env`. ``spawn.py`` starts the child with it.

A field left unset (None, False, empty) writes nothing: the child then inherits whatever its
parent's environment holds, as a script started by hand would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from prudent.kernel.errors import ConfigError

__all__ = ["ENV_ALERT_WEBHOOK", "ENV_CONFIG", "ENV_HOST", "host_name", "ENV_OVERRIDES", "ENV_PREFLIGHT_MODE",
           "ENV_PREFLIGHT_OUT", "ENV_PREFLIGHT_OVERFIT_STEPS", "ENV_PREFLIGHT_SCAN_S",
           "ENV_PREFLIGHT_STEPS", "ENV_PREFLIGHT_STOP_AT", "ENV_REPLAY", "ENV_REPLAY_PDB",
           "ENV_REPLAY_STEP", "ENV_RUN_ID", "ENV_RUN_NAME", "ENV_S3_ENDPOINT_URL", "ENV_SETTINGS",
           "ENV_SMOKE", "ENV_SUPERVISED", "ENV_TUNE_JOB", "ENV_TUNE_TRIAL", "ENV_TUNE_WORKER",
           "LaunchSpec", "PreflightSpec", "ReplaySpec", "TrialSpec", "overrides_from_env",
           "setting_var"]

ENV_RUN_ID = "PRUDENT_RUN_ID"
ENV_RUN_NAME = "PRUDENT_RUN_NAME"
ENV_SUPERVISED = "PRUDENT_SUPERVISED"  # the parent counts relaunches itself
ENV_SMOKE = "PRUDENT_SMOKE"  # a smoke run of prudent preflight
ENV_OVERRIDES = "PRUDENT_SET"  # JSON object: the user's hyperparameter overrides
ENV_CONFIG = "PRUDENT_CONFIG"  # the settings file (wiring/config.py reads it too)
ENV_TUNE_JOB = "PRUDENT_TUNE_JOB"  # JSON: what a tuning worker does
ENV_TUNE_WORKER = "PRUDENT_TUNE_WORKER_INDEX"
ENV_TUNE_TRIAL = "PRUDENT_TUNE_TRIAL"  # JSON: TrialSpec's fields (storage, study, trial_id, ...)
ENV_REPLAY = "PRUDENT_REPLAY"  # a capture bundle folder
ENV_REPLAY_STEP = "PRUDENT_REPLAY_STEP"
ENV_REPLAY_PDB = "PRUDENT_REPLAY_PDB"
ENV_PREFLIGHT_MODE = "PRUDENT_PREFLIGHT_MODE"
ENV_PREFLIGHT_STEPS = "PRUDENT_PREFLIGHT_STEPS"
ENV_PREFLIGHT_STOP_AT = "PRUDENT_PREFLIGHT_STOP_AT"
ENV_PREFLIGHT_OUT = "PRUDENT_PREFLIGHT_OUT"
ENV_PREFLIGHT_OVERFIT_STEPS = "PRUDENT_PREFLIGHT_OVERFIT_STEPS"
ENV_PREFLIGHT_SCAN_S = "PRUDENT_PREFLIGHT_SCAN_S"
# set by the user, not by a parent; named here so that every PRUDENT_* name has one home
ENV_S3_ENDPOINT_URL = "PRUDENT_S3_ENDPOINT_URL"
ENV_ALERT_WEBHOOK = "PRUDENT_ALERT_WEBHOOK"  # monitor.alert.webhook_url_env's default
ENV_HOST = "PRUDENT_HOST"  # the name recorded as an attempt's host (default: the hostname)

_T = TypeVar("_T")
Setting = tuple[str, str]  # (section, key) of prudent.yaml

# the variable that carries each of prudent's settings (a CLI flag maps onto the same pair);
# config.load_settings reads them in every process, child or not
ENV_SETTINGS: dict[str, Setting] = {
    "PRUDENT_HOME": ("store", "home"),
    "PRUDENT_STORE_URL": ("store", "url"),
    "PRUDENT_CONSOLE": ("console", "mode"),
    "PRUDENT_DEVICE": ("run", "device"),
    "PRUDENT_RANKS_AGREE_EVERY_S": ("run", "ranks_agree_every_s"),
    "PRUDENT_PROFILE": ("profile", "enabled"),
    "PRUDENT_PROFILE_STEPS": ("profile", "steps"),
    "PRUDENT_CHECKPOINT_URL": ("checkpoint", "url"),
    "PRUDENT_CHECKPOINT_EVERY": ("checkpoint", "every"),
    "PRUDENT_METADATA_URL": ("preemption", "metadata_url"),
    "PRUDENT_PREEMPTION_WATCH": ("preemption", "watch"),
    "PRUDENT_MONITOR": ("monitor", "enabled"),
    "PRUDENT_DEBUG": ("debug", "enabled"),
    "PRUDENT_CAPTURE": ("debug", "capture"),
    "PRUDENT_CHECKPOINT": ("checkpoint", "enabled"),
    "PRUDENT_INSTANCE": ("cost", "instance"),
    "PRUDENT_SPOT": ("cost", "spot"),
    "PRUDENT_NODES": ("cost", "nodes"),
    "PRUDENT_BUDGET_USD": ("cost", "budget_usd"),
    "PRUDENT_MAX_HOURS": ("cost", "max_hours"),
    "PRUDENT_CATALOG": ("cost", "catalog_file"),
    "PRUDENT_POLICY": ("cost", "policy_file"),
}
_SETTING_VARS = {pair: var for var, pair in ENV_SETTINGS.items()}


@dataclass(frozen=True)
class TrialSpec:
    """The Optuna trial a training process reports to (set by a ``prudent tune`` worker)."""

    storage: str
    study: str
    trial_id: int
    number: int
    objective: str
    pruner: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = None  # prudent tune --max-steps: the trial stops after this many


@dataclass(frozen=True)
class ReplaySpec:
    """What ``prudent replay`` asks: a bundle to replay, or a step to run to; pdb at the failure."""

    bundle: str | None = None
    step: int | None = None
    pdb: bool = False


@dataclass(frozen=True)
class PreflightSpec:
    """What ``prudent preflight`` asks of one smoke process (None: the probe's default)."""

    mode: str | None = None  # smoke | overfit
    steps: int | None = None
    stop_at: int | None = None
    out: str | None = None
    overfit_steps: int | None = None
    scan_s: float | None = None


_PREFLIGHT_VARS = {"mode": ENV_PREFLIGHT_MODE, "steps": ENV_PREFLIGHT_STEPS,
                   "stop_at": ENV_PREFLIGHT_STOP_AT, "out": ENV_PREFLIGHT_OUT,
                   "overfit_steps": ENV_PREFLIGHT_OVERFIT_STEPS, "scan_s": ENV_PREFLIGHT_SCAN_S}


@dataclass(frozen=True)
class LaunchSpec:
    """One child's launch: who it is, how it is configured, what it was asked to do.

    ``settings`` are prudent's own settings as ``{(section, key): value}`` (the pairs of
    :data:`ENV_SETTINGS`), resolved by the parent; ``overrides`` are the user's
    hyperparameters (None: not set by this parent; :meth:`from_env` always gives a dict).
    """

    run_id: str | None = None
    name: str | None = None
    overrides: dict[str, Any] | None = None
    supervised: bool = False
    smoke: bool = False
    config_path: str | None = None
    settings: dict[Setting, str] = field(default_factory=dict)
    trial: TrialSpec | None = None
    replay: ReplaySpec | None = None
    preflight: PreflightSpec | None = None
    tune_job: dict[str, Any] | None = None
    tune_worker: int | None = None

    def __post_init__(self) -> None:
        given = {k: str(v) for k, v in self.settings.items() if v is not None}
        object.__setattr__(self, "settings", given)

    def to_env(self) -> dict[str, str]:
        """The variables to set in the child's environment (unset fields are absent)."""
        env = _settings_env(self.settings)
        _put(env, ENV_RUN_ID, self.run_id)
        _put(env, ENV_RUN_NAME, self.name)
        _put(env, ENV_SUPERVISED, "1" if self.supervised else None)
        _put(env, ENV_SMOKE, "1" if self.smoke else None)
        _put(env, ENV_CONFIG, self.config_path)
        if self.overrides is not None:
            env[ENV_OVERRIDES] = json.dumps(dict(self.overrides), sort_keys=True)
        if self.tune_job is not None:
            env[ENV_TUNE_JOB] = json.dumps(self.tune_job)
        _put(env, ENV_TUNE_WORKER, self.tune_worker)
        if self.trial is not None:
            env[ENV_TUNE_TRIAL] = json.dumps({f.name: getattr(self.trial, f.name)
                                              for f in fields(TrialSpec)})
        env.update(_replay_env(self.replay))
        for name, var in _PREFLIGHT_VARS.items():
            _put(env, var, getattr(self.preflight, name, None))
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchSpec:
        """The spec this process was launched with; a malformed value raises ConfigError."""
        env = os.environ if environ is None else environ
        return cls(run_id=env.get(ENV_RUN_ID) or None, name=env.get(ENV_RUN_NAME) or None,
                   overrides=overrides_from_env(env),
                   supervised=bool(env.get(ENV_SUPERVISED)),
                   smoke=env.get(ENV_SMOKE, "") not in ("", "0"),
                   config_path=env.get(ENV_CONFIG) or None, settings=_settings_from(env),
                   trial=_trial_from(env), replay=_replay_from(env),
                   preflight=_preflight_from(env),
                   tune_job=_json_object(env, ENV_TUNE_JOB, "prudent tune"),
                   tune_worker=_number(env, ENV_TUNE_WORKER, int))


def overrides_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``--set`` overrides this process was given ({} when none)."""
    return _json_object(os.environ if environ is None else environ, ENV_OVERRIDES) or {}


def setting_var(section: str, key: str) -> str:
    """The variable that carries ``section.key`` of prudent.yaml to a child."""
    try:
        return _SETTING_VARS[(section, key)]
    except KeyError:
        raise KeyError(f"{section}.{key} has no environment variable (see ENV_SETTINGS)") from None


# writing -----------------------------------------------------------------------------------
def _put(env: dict[str, str], var: str, value: object) -> None:
    if value is not None:
        env[var] = str(value)


def _settings_env(settings: Mapping[Setting, str]) -> dict[str, str]:
    return {setting_var(*pair): value for pair, value in settings.items()}


def _replay_env(replay: ReplaySpec | None) -> dict[str, str]:
    if replay is None:
        return {}
    env = {ENV_REPLAY_PDB: "1" if replay.pdb else "0"}
    _put(env, ENV_REPLAY, replay.bundle)
    _put(env, ENV_REPLAY_STEP, replay.step)
    return env


# reading -----------------------------------------------------------------------------------
def _settings_from(env: Mapping[str, str]) -> dict[Setting, str]:
    return {pair: env[var] for var, pair in ENV_SETTINGS.items() if env.get(var)}


def _json_object(env: Mapping[str, str], var: str, set_by: str = "prudent run") -> Any:
    raw = env.get(var, "")
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{var} is not JSON ({exc}): it is set by {set_by}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{var} must be a JSON object, got {raw!r}")
    return value


def _number(env: Mapping[str, str], var: str, kind: Callable[[str], _T]) -> _T | None:
    raw = env.get(var, "")
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{var} must be a number, got {raw!r}: it is set by prudent") from None


def _trial_from(env: Mapping[str, str]) -> TrialSpec | None:
    value = _json_object(env, ENV_TUNE_TRIAL, "prudent tune")
    if value is None:
        return None
    try:
        max_steps = value.get("max_steps")
        return TrialSpec(str(value["storage"]), str(value["study"]), int(value["trial_id"]),
                         int(value["number"]), str(value["objective"]),
                         dict(value.get("pruner") or {}),
                         None if max_steps is None else int(max_steps))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{ENV_TUNE_TRIAL} lacks or mangles {exc}: it is set by prudent "
                          "tune") from None


def _replay_from(env: Mapping[str, str]) -> ReplaySpec | None:
    bundle, step = env.get(ENV_REPLAY) or None, _number(env, ENV_REPLAY_STEP, int)
    pdb = env.get(ENV_REPLAY_PDB, "") not in ("", "0")
    if bundle is None and step is None and ENV_REPLAY_PDB not in env:
        return None
    return ReplaySpec(bundle, step, pdb)


def _preflight_from(env: Mapping[str, str]) -> PreflightSpec | None:
    if not any(env.get(var) for var in _PREFLIGHT_VARS.values()):
        return None
    return PreflightSpec(mode=env.get(ENV_PREFLIGHT_MODE) or None,
                         steps=_number(env, ENV_PREFLIGHT_STEPS, int),
                         stop_at=_number(env, ENV_PREFLIGHT_STOP_AT, int),
                         out=env.get(ENV_PREFLIGHT_OUT) or None,
                         overfit_steps=_number(env, ENV_PREFLIGHT_OVERFIT_STEPS, int),
                         scan_s=_number(env, ENV_PREFLIGHT_SCAN_S, float))


def host_name() -> str:
    """The machine's name as the record gives it: ``PRUDENT_HOST`` when set (a Kubernetes
    node's name when every pod is called train-0), else the hostname."""
    import socket

    return os.environ.get(ENV_HOST) or socket.gethostname()
