"""Human-friendly values parsed in one place: ids, durations, and `--set` scalars."""

from __future__ import annotations

import math
import re

from prudent.kernel.errors import ConfigError

__all__ = ["parse_duration_s", "parse_hours", "parse_interval", "parse_usd", "validate_run_id"]

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|sec|min|m|h|hr|d)?\s*$")
_SECONDS = {None: 1.0, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
            "hr": 3600.0, "d": 86400.0}


def validate_run_id(run_id: str) -> str:
    """A run id names a folder under ``<store.home>/runs``, so it must be a safe file name."""
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


_USD = re.compile(r"^\s*\$?\s*(-?[0-9]*\.?[0-9]+)\s*(usd|\$)?\s*$", re.IGNORECASE)


def parse_usd(value: str | float, what: str = "amount") -> float:
    """``"$40"``, ``"40usd"``, ``"12.5"`` or a number, as US dollars (never negative)."""
    usd = _number_or_none(value)
    if usd is None:
        match = None if isinstance(value, bool) else _USD.match(str(value))
        if not match:
            raise ConfigError(f"{what} {value!r} is invalid: write dollars, e.g. '$40' or 40")
        usd = float(match.group(1))
    if usd < 0 or math.isnan(usd):
        raise ConfigError(f"{what} {value!r} is invalid: it must be >= 0 dollars, e.g. '$40'")
    return usd


def _number_or_none(value: object) -> float | None:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if is_number else None  # type: ignore[arg-type]


def parse_hours(value: str | float, what: str = "duration") -> float:
    """Hours: a bare number means hours (``12``), a string may carry a unit (``"90min"``)."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} {value!r} is invalid: write hours, e.g. 12 or '90min'")
    try:
        hours = float(value)
    except ValueError:
        if not _DURATION.match(str(value)):
            raise ConfigError(f"{what} {value!r} is invalid: write hours, e.g. 12 or '90min'") from None
        hours = parse_duration_s(value) / 3600.0
    if hours <= 0 or math.isnan(hours):
        raise ConfigError(f"{what} {value!r} is invalid: it must be > 0 hours, e.g. 12 or '90min'")
    return hours
