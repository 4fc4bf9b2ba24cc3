"""MlflowSink: one MLflow run per prudent run, continued after a relaunch or on a new machine.

Metrics go to ``log_batch`` under their own names, at their step. The config becomes params,
prudent's events tags (``prudent.event.<kind>.<name>``: the newest message) and marker metrics
(``prudent.event.<kind>`` = 1 at the event's step); the profile's summary numbers become
``prudent.profile.*`` metrics; the end tags ``prudent.status``, ``prudent.stop_reason``,
``prudent.verdict``, a ``prudent.cost_usd`` metric, the attempt's events as a text artifact and
the HTML report (when there is one) as an artifact; the MLflow run ends FINISHED, KILLED
(stopped) or FAILED.

Resume: the MLflow run id is kept in ``<run folder>/tracking.json``; on another machine (no
such file) the run is found by its ``prudent.run_id`` tag. Either way, a relaunch continues the
same MLflow run (back to RUNNING) instead of starting a second one.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from prudent.tracking.base import (
    Row,
    RunInfo,
    TrackerRefused,
    TrackerSink,
    event_payload,
    event_text,
    flat_params,
    require,
)
from prudent.tracking.settings import MlflowSettings

__all__ = ["MlflowSink", "active_mlflow_run"]

RUN_ID_TAG = "prudent.run_id"
_END_STATUS = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}
_BATCH = 1000  # MLflow's most metrics per log_batch
_PARAMS_BATCH = 100


class MlflowSink(TrackerSink):
    name = "mlflow"

    def __init__(self, settings: MlflowSettings, info: RunInfo,
                 active_run_id: str | None = None, metric_prefix: str = "") -> None:
        """``active_run_id``: an MLflow run someone else started (the script's
        ``mlflow.start_run()`` before ``prudent.init``, a framework's logger), written into
        and left for its owner to end; ``metric_prefix`` goes before prudent's metric names."""
        self._mlflow = require("mlflow", "mlflow")
        self.settings = settings
        self.info = info
        self.run_id: str | None = None
        self._active = active_run_id
        self.metric_prefix = metric_prefix
        if active_run_id is not None:
            self.target = f"mlflow:{active_run_id}"
        self._client: Any = None
        self._events: list[str] = []  # this attempt's, for the text artifact at the end
        self._started = time.strftime("%Y%m%d-%H%M%S")

    # connect --------------------------------------------------------------------------------
    def open(self) -> None:
        client = self._mlflow.MlflowClient(tracking_uri=self.settings.tracking_uri)
        if self._active is not None:
            client.set_tag(self._active, RUN_ID_TAG, self.info.run_id)
            self._client, self.run_id = client, self._active
            return
        experiment_id = self._experiment_id(client)
        run_id = self._known_run(client, experiment_id)
        if run_id is None:
            run = client.create_run(experiment_id, run_name=self.info.run_id,
                                    tags={RUN_ID_TAG: self.info.run_id,
                                          "prudent.name": self.info.name})
            run_id = run.info.run_id
        else:
            client.update_run(run_id, status="RUNNING")
        self._client, self.run_id = client, run_id
        self._remember(run_id, client.tracking_uri)

    def _experiment_id(self, client: Any) -> str:
        name = self.settings.experiment
        if name is None:
            return "0"  # MLflow's Default experiment
        found = client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else client.create_experiment(name)

    def _known_run(self, client: Any, experiment_id: str) -> str | None:
        """The MLflow run an earlier attempt used: from the run's folder, else by its tag."""
        kept = self._state().get("mlflow_run_id")
        if kept is not None:
            try:
                if client.get_run(kept).info.lifecycle_stage == "active":
                    return kept
            except self._mlflow.exceptions.MlflowException:
                pass  # deleted, or another server: look it up by tag
        found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = "
                                   f"'{self.info.run_id}'", max_results=1)
        return found[0].info.run_id if found else None

    def _state(self) -> dict[str, Any]:
        path = self.info.run_dir / "tracking.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        same = state.get("mlflow_tracking_uri") in (None, self.settings.tracking_uri)
        return state if isinstance(state, dict) and same else {}

    def _remember(self, run_id: str, tracking_uri: str) -> None:
        path = self.info.run_dir / "tracking.json"
        try:
            state = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            state = {}
        state.update(mlflow_run_id=run_id, mlflow_tracking_uri=self.settings.tracking_uri)
        path.write_text(json.dumps(state, indent=1))

    # write ----------------------------------------------------------------------------------
    def write_metrics(self, rows: list[Row]) -> None:
        entities = self._mlflow.entities
        prefix = self.metric_prefix
        metrics = [entities.Metric(_key(prefix + r["name"]), r["value"], int(r["wall"] * 1000), r["step"])
                   for r in rows if r["value"] is not None]
        self._batches(metrics=metrics)

    def write_events(self, rows: list[Row]) -> None:
        entities = self._mlflow.entities
        metrics, tags = [], {}
        for row in rows:
            wall_ms = int(row["wall"] * 1000)
            self._events.append(f"step {row['step']}: {event_text(row)}")
            tags[f"prudent.event.{_key(row['kind'])}.{_key(row['name'])}"] = (
                row.get("message") or "")[:4000]
            metrics.append(entities.Metric(f"prudent.event.{_key(row['kind'])}", 1.0, wall_ms,
                                           row["step"]))
            if (row["kind"], row["name"]) == ("profile", "summary"):
                metrics += [entities.Metric(f"prudent.profile.{_key(k)}", float(v), wall_ms,
                                            row["step"])
                            for k, v in event_payload(row).items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)]
        self._batches(metrics=metrics, tags=[entities.RunTag(k, v) for k, v in tags.items()])

    def write_config(self, config: dict[str, Any]) -> None:
        """Params once: MLflow refuses to change one, so a value that differs on a relaunch
        (a new ``--set``) is kept as a ``prudent.param_changed.<key>`` tag instead."""
        entities = self._mlflow.entities
        logged = self._client.get_run(self.run_id).data.params
        params, tags = [], []
        for key, value in flat_params(config).items():
            key, value = _key(key), value[:6000]
            if key not in logged:
                params.append(entities.Param(key, value))
            elif logged[key] != value:
                tags.append(entities.RunTag(f"prudent.param_changed.{key}", value))
        self._batches(params=params, tags=tags)

    def write_summary(self, summary: dict[str, Any]) -> None:
        entities = self._mlflow.entities
        tags = [entities.RunTag(f"prudent.{key}", str(value)[:4000])
                for key, value in summary.items() if value is not None]
        metrics = []
        if summary.get("cost_usd") is not None:
            metrics.append(entities.Metric("prudent.cost_usd", float(summary["cost_usd"]),
                                           int(time.time() * 1000), summary["step"]))
        self._batches(metrics=metrics, tags=tags)
        if summary.get("report_path"):
            self._client.log_artifact(self.run_id, summary["report_path"], "prudent")

    def _batches(self, metrics: list[Any] = (), params: list[Any] = (),  # type: ignore[assignment]
                 tags: list[Any] = ()) -> None:  # type: ignore[assignment]
        try:
            for i in range(0, len(metrics), _BATCH):
                self._client.log_batch(self.run_id, metrics=metrics[i:i + _BATCH])
            for i in range(0, max(len(params), len(tags)), _PARAMS_BATCH):
                self._client.log_batch(self.run_id, params=params[i:i + _PARAMS_BATCH],
                                       tags=tags[i:i + _PARAMS_BATCH])
        except self._mlflow.exceptions.MlflowException as exc:
            if _refused(exc):
                raise TrackerRefused(str(exc)[:300]) from None
            raise

    def close(self, status: str) -> None:
        if self._client is None or self.run_id is None:
            return
        if self._events:
            self._client.log_text(self.run_id, "\n".join(self._events) + "\n",
                                  f"prudent/events-{self._started}.txt")
        if self._active is None:  # the script's own run: the script ends it
            self._client.set_terminated(self.run_id, _END_STATUS.get(status, "FINISHED"))


def active_mlflow_run() -> tuple[str, str] | None:
    """The MLflow run the script started (``mlflow.start_run()``), as (run id, tracking URI);
    None when MLflow is not even imported (nothing is imported here)."""
    import sys

    mlflow = sys.modules.get("mlflow")
    active = mlflow.active_run() if mlflow is not None else None
    return None if active is None else (active.info.run_id, mlflow.get_tracking_uri())


def _key(name: str) -> str:
    """A name MLflow takes: letters, digits, ``_ - . / space``; anything else becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", str(name))[:250] or "_"


def _refused(exc: Any) -> bool:
    """The server answered and said no (bad input), as opposed to being unreachable."""
    return getattr(exc, "error_code", "") in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST",
                                               "RESOURCE_ALREADY_EXISTS")
