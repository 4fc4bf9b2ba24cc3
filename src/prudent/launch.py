"""What a prudent parent hands the child it starts: one :class:`LaunchSpec`.

``prudent run``, ``tune``, ``preflight`` and ``replay`` start the user's script as a child
process; the child learns its run id, name, ``--set`` overrides and the rest from its
environment. Every variable that crosses that boundary is named here, built by
:meth:`LaunchSpec.to_env` and read by :meth:`LaunchSpec.from_env`, and nowhere else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prudent.errors import ConfigError

__all__ = ["ENV_OVERRIDES", "ENV_RUN_ID", "ENV_RUN_NAME", "ENV_SMOKE", "ENV_SUPERVISED",
           "LaunchSpec", "overrides_from_env"]

ENV_RUN_ID = "PRUDENT_RUN_ID"
ENV_RUN_NAME = "PRUDENT_RUN_NAME"
ENV_SUPERVISED = "PRUDENT_SUPERVISED"
ENV_SMOKE = "PRUDENT_SMOKE"
ENV_OVERRIDES = "PRUDENT_SET"  # JSON object of the user's hyperparameter overrides


@dataclass(frozen=True)
class LaunchSpec:
    """One child's launch: who it is and what it was asked to do."""

    run_id: str | None = None
    name: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    supervised: bool = False
    smoke: bool = False

    def to_env(self) -> dict[str, str]:
        """The variables to set in the child's environment (unset fields are absent)."""
        env = {ENV_OVERRIDES: json.dumps(dict(self.overrides), sort_keys=True)}
        if self.run_id:
            env[ENV_RUN_ID] = self.run_id
        if self.name:
            env[ENV_RUN_NAME] = self.name
        if self.supervised:
            env[ENV_SUPERVISED] = "1"
        if self.smoke:
            env[ENV_SMOKE] = "1"
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchSpec:
        """The spec this process was launched with; a malformed value raises ConfigError."""
        env = os.environ if environ is None else environ
        return cls(run_id=env.get(ENV_RUN_ID) or None, name=env.get(ENV_RUN_NAME) or None,
                   overrides=overrides_from_env(env),
                   supervised=bool(env.get(ENV_SUPERVISED)),
                   smoke=env.get(ENV_SMOKE, "") not in ("", "0"))


def overrides_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``--set`` overrides in ``$PRUDENT_SET`` ({} when unset)."""
    raw = (os.environ if environ is None else environ).get(ENV_OVERRIDES, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{ENV_OVERRIDES} is not JSON ({exc}): it is set by prudent run") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{ENV_OVERRIDES} must be a JSON object, got {raw!r}")
    return value
