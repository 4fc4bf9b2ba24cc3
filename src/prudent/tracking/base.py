"""TrackerSink: what a tracker (TensorBoard, MLflow, W&B) gets of a run, and its contract.

A sink is called on the tracking thread only (:class:`~prudent.tracking.dispatch.TrackingDispatcher`),
never on the training thread, one call at a time, in the order things happened. Any call may
raise: what it was handed is kept and handed again later (the tracker is down; a
:class:`TrackerRefused` drops it instead), at most
``max_buffered_rows`` rows, past which the oldest are dropped and counted. So a sink must
tolerate being handed the same rows twice after a failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from prudent.kernel.errors import ConfigError

__all__ = ["Row", "RunInfo", "TrackerRefused", "TrackerSink", "event_payload", "event_text", "flat_params", "require"]

Row = dict[str, Any]  # a metric row {step, name, value, wall} or an event row (the store's)


@dataclass(frozen=True)
class RunInfo:
    """The run as a tracker names it: ``run_id`` is stable across relaunches and machines, so
    a tracker run derived from it (or remembered in ``run_dir``) is continued, not restarted."""

    run_id: str
    name: str
    run_dir: Path


class TrackerRefused(Exception):
    """Raised by a sink when the tracker answered and refused what it was handed (a name or
    value it does not take): those rows are dropped and counted, not tried again (trying
    would hold up every row behind them). Never reaches the training loop."""


class TrackerSink:
    """One tracker. ``open`` connects (or resumes the tracker's run); the ``write_*`` calls send;
    ``close`` ends the tracker's run (``status``: prudent's, "completed", "stopped" or "failed").
    """

    name: ClassVar[str] = "tracker"
    # what it writes into when someone else started it ("wandb:<run id>"): one sink a target
    target: str = ""
    metric_prefix: str = ""  # before prudent's metric names (in a framework's logger)

    def open(self) -> None:
        """Connect; raise while the tracker cannot be reached (retried later)."""

    def write_metrics(self, rows: list[Row]) -> None:
        """Metric rows ``{step, name, value, wall}``, in step order per name."""

    def write_events(self, rows: list[Row]) -> None:
        """prudent's events: ``{step, kind, name, message, payload (JSON text), wall}``."""

    def write_config(self, config: dict[str, Any]) -> None:
        """The run's hyperparameters (``run.config`` as resolved), once per attempt."""

    def write_summary(self, summary: dict[str, Any]) -> None:
        """The end of the attempt: status, stop reason, verdict, cost, profile, report path."""

    def flush(self) -> None:
        """Make what was written durable (called after each round of writes)."""

    def close(self, status: str) -> None:
        """End the tracker's run; called once, even when ``open`` never succeeded."""


def require(module: str, extra: str) -> Any:
    """Import an optional tracker library, or a :class:`ConfigError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"tracking.{extra} is configured but {module!r} is not installed: "
                          f"pip install 'prudent[{extra}]' (or remove tracking.{extra} from "
                          "prudent.yaml)") from None


def event_text(row: Row) -> str:
    """One line for a person: ``[kind/name] message``."""
    return f"[{row['kind']}/{row['name']}] {row.get('message') or ''}".rstrip()


def event_payload(row: Row) -> dict[str, Any]:
    try:
        payload = json.loads(row.get("payload") or "{}")
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested hyperparameters as dotted keys with string values (``model.hidden``)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value,
                                                                                   default=str)
    return out
