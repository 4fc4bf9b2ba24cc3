"""Human-friendly values parsed in one place: ids, durations, and `--set` scalars."""

from __future__ import annotations

import re

from prudent.errors import ConfigError

__all__ = ["parse_duration_s", "parse_interval", "validate_run_id"]

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|sec|min|m|h|hr|d)?\s*$")
_SECONDS = {None: 1.0, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
            "hr": 3600.0, "d": 86400.0}


def validate_run_id(run_id: str) -> str:
    """A run id names a folder under ``$PRUDENT_HOME/runs``, so it must be a safe file name."""
    if not _RUN_ID.match(run_id or "") or run_id in {".", ".."}:
        raise ConfigError(
            f"run id {run_id!r} is invalid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names a folder under .prudent/runs)"
        )
    return run_id


def parse_duration_s(value: str | float | int) -> float:
    """``"90s"``, ``"10min"``, ``"1.5h"`` or a number of seconds, as seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ConfigError(
            f"duration {value!r} is invalid: write a number with a unit, e.g. '90s', '10min', '2h'"
        )
    return float(match.group(1)) * _SECONDS[match.group(2)]


_INTERVAL = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(steps?|epochs?|ms|s|sec|min|m|h|hr|d)\s*$")


def parse_interval(value: str | int) -> tuple[str, float]:
    """``"500steps"`` -> ("steps", 500); ``"10min"`` -> ("seconds", 600); ``"1epoch"``;
    ``"auto"`` -> ("auto", 0); ``"off"`` -> ("off", 0). A bare number means steps."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = f"{value}steps"
    text = str(value).strip().lower()
    if text in ("auto", "off"):
        return text, 0.0
    match = _INTERVAL.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"interval {value!r} is invalid: write '500steps', '10min', '1epoch', "
                          "'auto' or 'off'")
    amount, unit = float(match.group(1)), match.group(2)
    if unit.startswith("step"):
        return "steps", amount
    if unit.startswith("epoch"):
        return "epochs", amount
    return "seconds", amount * _SECONDS[unit]
