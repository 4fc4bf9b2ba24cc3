"""What each page shows, as one JSON-able dict: the runs table, a run, runs compared.

The same dicts feed the self-contained report (inlined) and the dashboard (its JSON API), so
the two cannot drift. They reuse what the command line computes: the cost breakdown of
``prudent cost`` / ``show --json`` (:func:`prudent.cost.commands.breakdown`), the profile
summary and findings the profiler recorded, the run folder's ``profile.json`` timeline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from prudent.kernel.loop_times import TOKENS
from prudent.profile.summary import attempts
from prudent.report.downsample import PROFILE_PREFIX, profile_timeline, run_series
from prudent.report.reader import ReadOnlyStore
from prudent.store.database import run_folder

__all__ = ["MARKER_KINDS", "compare_page", "marker_kind", "run_page", "runs_page", "verdict"]

# Events drawn on the curves, by what a person calls them.
MARKER_KINDS = ("checkpoint", "rule", "restart", "preemption", "budget", "capture", "finding",
                "stop")
_MARKER_OF = {("checkpoint", "saved"): "checkpoint", ("checkpoint", "resumed"): "restart",
              ("checkpoint", "record_imported"): "restart", ("preemption", "notice"): "preemption",
              ("cost", "limit"): "budget", ("capture", "written"): "capture",
              ("lifecycle", "stop_requested"): "stop"}
MAX_MARKERS_PER_KIND = 400  # checkpoints of a long run: evenly thinned, first and last kept
MAX_EVENT_ROWS = 2000


def runs_page(store: ReadOnlyStore, studies: list[str], limit: int = 1000,
              last_metrics: Callable[[str], dict[str, float | None]] | None = None
              ) -> dict[str, Any]:
    """Every run (newest first) with what the runs table shows, and the studies.
    ``last_metrics``: where each run's last values come from (the dashboard caches them)."""
    last_metrics = last_metrics or store.last_metrics
    now = time.time()
    rows = []
    for run in store.list_runs(limit):
        ended = run["ended_at"] or (now if run["status"] == "running" else None)
        rows.append({k: run[k] for k in ("id", "name", "status", "stop_reason", "started_at",
                                         "step", "epoch", "restarts", "cost_usd")}
                    | {"duration_s": round(ended - run["started_at"], 3) if ended else None,
                       "metrics": {name: value for name, value in last_metrics(run["id"]).items()
                                   if is_model_metric(name)}})
    return {"page": "runs", "runs": rows, "studies": studies}


def run_page(store: ReadOnlyStore, run_id: str, home: str | Path | None = None,
             series: bool = True) -> dict[str, Any]:
    """One run: summary, curves with their event markers, profile, cost, config, events.
    ``series=False``: all but the curves and the last metric values (``series`` is None),
    which cost a pass over the run's metric rows."""
    from prudent.cost.commands import breakdown

    token = store.metrics_token(run_id)  # before the reads: newer rows make the next token
    run = store.get_run(run_id)
    if run is None:
        raise KeyError(run_id)
    events = store.events(run_id)
    summaries = [e["payload"] for e in events if (e["kind"], e["name"]) == ("profile", "summary")]
    profile = summaries[-1] if summaries else None
    curves = _model_series(run_series(store, run_id, run["step"])) if series else None
    summary = _summary(run, store.last_values(run_id, [s["name"] for s in curves or []]))
    end = _newest(events, "lifecycle", "end")
    if end is not None and "epochs" in end and end["epochs"] is None:
        summary["epoch"] = None  # an iteration loop (run.steps) has no epochs: not "epoch 0"
    findings = [{"id": e["name"], "step": e["step"], "message": e["message"]}
                for e in events if e["kind"] == "finding"]
    return {
        "page": "run", "run": summary, "verdict": verdict(summary, findings),
        "token": token,
        "series": curves, "markers": _markers(events), "events": _event_rows(events),
        "profile": profile, "profile_attempts": attempts(summaries),
        "timeline": _timeline(store, home, run), "findings": findings,
        "cost": breakdown(store, run_id), "cost_over_time": _cost_over_time(run, events),
    }


def compare_page(store: ReadOnlyStore, run_ids: list[str]) -> dict[str, Any]:
    """Several runs: their curves overlaid, their configs side by side."""
    runs = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        if run is None:
            raise KeyError(run_id)
        series = _model_series(run_series(store, run_id, run["step"]))
        runs.append({"run": _summary(run, store.last_values(run_id, [s["name"] for s in series])),
                     "series": series})
    keys = sorted({k for r in runs for k in _flat(r["run"]["config"])})
    table = [{"key": k, "values": [_flat(r["run"]["config"]).get(k) for r in runs]} for k in keys]
    for row in table:
        row["differs"] = len({json.dumps(v, sort_keys=True) for v in row["values"]}) > 1
    return {"page": "compare", "runs": runs, "config": table}


def verdict(run: dict[str, Any], findings: list[dict[str, Any]] | None = None) -> str:
    """One line: how the run ended, how far it got, its last metrics, findings and cost."""
    status = run["status"]
    how = f"{status} ({run['stop_reason']})" if run.get("stop_reason") else status
    took = f" after {timedelta(seconds=round(run['duration_s']))}" if run.get("duration_s") else ""
    restarts = f", {run['restarts']} restart{'s' * (run['restarts'] != 1)}" \
        if run.get("restarts") else ""
    metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(run["metrics"].items())[:4]
                       if v is not None)
    found = f"; findings: {', '.join(sorted({f['id'] for f in findings}))}" if findings else ""
    return (f"run {run['id']} {how}{took}, {run['step']} steps{restarts}"
            f"{'; ' + metrics if metrics else ''}{found}; cost ${run['cost_usd']:.2f}")


def marker_kind(event: dict[str, Any]) -> str | None:
    """The marker an event draws on the curves (see MARKER_KINDS), or None."""
    by_kind = {"rule": "rule", "finding": "finding", "capture_requested": "capture"}
    if event["kind"] in by_kind:  # their names are a rule's or a finding's
        return by_kind[event["kind"]]
    if (event["kind"], event["name"]) == ("lifecycle", "start") and event.get("attempt", 0):
        return "restart"  # a later attempt of the run started
    return _MARKER_OF.get((event["kind"], event["name"]))


def _summary(run: dict[str, Any], metrics: dict[str, float | None]) -> dict[str, Any]:
    ended = run["ended_at"] or (time.time() if run["status"] == "running" else None)
    keys = ("id", "name", "status", "stop_reason", "config", "restarts", "cost_usd", "step",
            "epoch", "host", "command", "exit_code", "started_at", "ended_at")
    return {k: run[k] for k in keys} | {
        "metrics": metrics,
        "duration_s": round(ended - run["started_at"], 3) if ended else None}


def _newest(events: list[dict[str, Any]], kind: str, name: str) -> Any:
    found = [e["payload"] for e in events if (e["kind"], e["name"]) == (kind, name)]
    return found[-1] if found else None


def _markers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    starts = 0
    for event in events:
        if (event["kind"], event["name"]) == ("lifecycle", "start"):
            event = {**event, "attempt": starts}
            starts += 1
        kind = marker_kind(event)
        if kind is not None:
            by_kind.setdefault(kind, []).append(
                {"step": event["step"], "kind": kind, "name": event["name"],
                 "message": event["message"], "wall": event["wall"]})
    return [m for kind in MARKER_KINDS for m in _thin(by_kind.get(kind, []))]


def _thin(items: list[Any], most: int = MAX_MARKERS_PER_KIND) -> list[Any]:
    if len(items) <= most:
        return items
    stride = (len(items) - 1) / (most - 1)
    return [items[round(i * stride)] for i in range(most)]


def _event_rows(events: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [{k: e[k] for k in ("step", "kind", "name", "message", "wall")} for e in events]
    return {"total": len(rows), "rows": rows[-MAX_EVENT_ROWS:]}


def _model_series(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curves of the model (loss, metrics, lr): the profiler's machine series are drawn
    on their own charts."""
    return [s for s in series if is_model_metric(s["name"])]


def is_model_metric(name: str) -> bool:
    """Not the profiler's machine series, nor ``run.step(tokens=n)``: a counter whose rate
    (tokens/s) the profile shows; drawn as a metric it is a flat line at the batch's size."""
    return not name.startswith(PROFILE_PREFIX) and name != TOKENS


def _timeline(store: ReadOnlyStore, home: str | Path | None, run: dict[str, Any]
              ) -> list[dict[str, Any]]:
    """The profiler's samples (throughput, CPU, GPU, memory, the time split, every few
    seconds): from the run's ``profile.json`` when its folder is on this machine, else from
    the store (a run that ran elsewhere, or is still running)."""
    if home is not None:
        path = run_folder(home, run["id"]) / "profile.json"
        try:
            return list(json.loads(path.read_text()).get("timeline") or [])
        except (OSError, ValueError, AttributeError):
            pass
    return profile_timeline(store, run["id"], run["started_at"], last_step=run["step"])


def _cost_over_time(run: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    points = [{"wall": run["started_at"], "usd": 0.0, "step": 0}]
    for e in events:
        if e["kind"] == "cost" and e["name"] in ("meter", "limit") and "total_usd" in e["payload"]:
            points.append({"wall": e["wall"], "usd": e["payload"]["total_usd"], "step": e["step"]})
    if run["cost_usd"] > points[-1]["usd"]:  # a running run: what its meter has written so far
        points.append({"wall": run["ended_at"] or time.time(), "usd": run["cost_usd"],
                       "step": run["step"]})
    return points


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, dict):
        return {prefix: config}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        flat.update(_flat(value, name) if isinstance(value, dict) and value else {name: value})
    return flat
