"""WandbSink: one Weights & Biases run per prudent run, continued after a relaunch.

Metrics go to ``run.log(..., step=<prudent's step>)``. Each prudent event is a marker metric
``prudent/event/<kind>`` = 1 at its step, the newest message per kind and name in the summary
(``prudent/event/<kind>/<name>``), the attempt's event lines in the summary
(``prudent/events``) and, at the end, a table ``prudent/event_table``; online, a rule, a
preemption, a monitor or a stop is also a W&B alert (alerts need the server). The config is
``run.config``; the profile's summary numbers are ``prudent/profile/*`` metrics; the end
(status, stop reason, verdict, cost, ...) is ``prudent/*`` in ``run.summary``, and the HTML
report, when there is one, a file of the run.

A run the script or the framework started (``wandb.init`` before ``prudent.init``, Lightning's
``WandbLogger``, the HF Trainer's ``report_to="wandb"``) is written into instead
(:meth:`WandbSink.around`): prudent's rows carry their step as ``prudent/step`` (W&B's own step
is the script's), the config only adds keys the run lacks, and the run is left for its owner to
finish.

Resume: the W&B run id is derived from prudent's run id and opened with ``resume="allow"``,
so a relaunch continues the same W&B run. W&B refuses a step lower than the last it took, so
the last step sent is kept in ``<run folder>/tracking.json`` (and read from the server when
it resumes online): rows at steps an earlier attempt already sent are not sent again (the
first attempt's values stay), so no step appears twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from prudent.tracking.base import Row, RunInfo, TrackerSink, event_payload, event_text, require
from prudent.tracking.settings import WandbSettings

__all__ = ["WandbSink", "active_wandb_run", "wandb_run_id"]

_ALERT_KINDS = ("rule", "preemption", "monitor")  # and lifecycle/stop_requested
_EVENT_LINES = 200  # the newest kept in the summary's text
_END_EXIT_CODE = {"completed": 0, "stopped": 1, "failed": 1}
STEP_KEY = "prudent/step"  # prudent's step in a run whose W&B step is its owner's


class WandbSink(TrackerSink):
    name = "wandb"

    def __init__(self, settings: WandbSettings, info: RunInfo) -> None:
        self._wandb = require("wandb", "wandb")
        self.settings = settings
        self.info = info
        self.run: Any = None
        self.num_skipped = 0  # metric values at steps an earlier attempt already sent
        self._floor = 0  # the lowest step W&B still takes
        self._metric_step = -1  # the highest step metrics arrived for (they arrive in order)
        self._pending: dict[int, dict[str, float]] = {}
        self._summary: dict[str, Any] = {}
        self._events: list[tuple[int, str, str, str]] = []  # this attempt's
        self._exit_code: int | None = None
        self._owned = True  # prudent started the W&B run: it finishes it
        self.metric_prefix = ""
        self._defined: set[str] = set()  # keys plotted against STEP_KEY (an adopted run)

    @classmethod
    def around(cls, run: Any, info: RunInfo, metric_prefix: str = "") -> WandbSink:
        """A W&B run someone else started (the script's ``wandb.init``, a framework's logger):
        prudent's rows go into it from the tracking thread, each at ``prudent/step`` (W&B's
        own step stays the owner's, which ``run.log`` calls without a step advance), and
        prudent never finishes it. ``metric_prefix`` goes before prudent's metric names."""
        sink = cls(WandbSettings(), info)
        sink.run, sink._owned, sink.metric_prefix = run, False, metric_prefix
        sink.target = f"wandb:{run.id}"
        return sink

    # connect --------------------------------------------------------------------------------
    def open(self) -> None:
        if not self._owned:
            return
        wandb, settings = self._wandb, self.settings
        # prudent's run only: no console capture, no system metrics or machine metadata
        # (those probe cloud metadata endpoints), no code or job upload
        quiet = wandb.Settings(silent=True, console="off", x_disable_stats=True,
                               x_disable_meta=True, x_disable_machine_info=True,
                               disable_code=True, disable_job_creation=True)
        run = wandb.init(project=settings.project, entity=settings.entity, dir=settings.dir,
                         mode=settings.mode, id=wandb_run_id(self.info.run_id),
                         name=self.info.name, resume="allow", reinit="create_new",
                         settings=quiet)
        state = self._state()
        kept = state.get("wandb_last_step") if state.get("wandb_run") == self._key() else None
        self._floor = max(kept + 1 if isinstance(kept, int) else 0,
                          run.step if run.resumed else 0)
        self.run = run

    def _key(self) -> str:
        return f"{self.settings.entity}/{self.settings.project}/{wandb_run_id(self.info.run_id)}"

    def _state(self) -> dict[str, Any]:
        """``tracking.json`` in the run's folder (shared with the other trackers)."""
        try:
            state = json.loads((self.info.run_dir / "tracking.json").read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _remember(self, last_step: int) -> None:
        state = self._state()
        state.update(wandb_run=self._key(), wandb_last_step=last_step)
        self.info.run_dir.mkdir(parents=True, exist_ok=True)
        (self.info.run_dir / "tracking.json").write_text(json.dumps(state, indent=1))

    # write ----------------------------------------------------------------------------------
    def write_metrics(self, rows: list[Row]) -> None:
        for row in rows:
            self._metric_step = max(self._metric_step, row["step"])
            if row["value"] is not None:
                name = self.metric_prefix + row["name"]
                self._pending.setdefault(row["step"], {})[name] = row["value"]

    def write_events(self, rows: list[Row]) -> None:
        for row in rows:
            step, kind, name = row["step"], row["kind"], row["name"]
            message = row.get("message") or ""
            self._events.append((step, kind, name, message))
            self._summary[f"prudent/event/{kind}/{name}"] = message
            values = self._pending.setdefault(step, {})
            values[f"prudent/event/{kind}"] = 1.0
            if (kind, name) == ("profile", "summary"):
                values.update({f"prudent/profile/{k}": v for k, v in event_payload(row).items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool)})
            if self.run is not None and not self.run.offline and _alerts(kind, name):
                self.run.alert(title=f"prudent: {kind}/{name}", text=event_text(row),
                               level=self._wandb.AlertLevel.WARN, wait_duration=0)
        if rows:
            lines = [f"step {s}: [{k}/{n}] {m}".rstrip() for s, k, n, m in self._events]
            self._summary["prudent/events"] = "\n".join(lines[-_EVENT_LINES:])

    def write_config(self, config: dict[str, Any]) -> None:
        if self._owned:
            self.run.config.update(config, allow_val_change=True)
        else:  # the owner's values stay (as MLflow keeps a param once)
            self.run.config.setdefaults(config)

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._exit_code = summary.get("exit_code")
        self._summary.update({f"prudent/{key}": value for key, value in summary.items()
                              if value is not None and key != "report_path"})
        if summary.get("report_path"):
            self.run.save(summary["report_path"], base_path=str(self.info.run_dir),
                          policy="now")

    def flush(self) -> None:
        """Send the round's rows, one W&B row per step in step order (the events of a round
        can be at a lower step than its metrics). A step past the newest metrics waits for
        them (an event can arrive before the metrics of the steps before it: sent first, it
        would move W&B's step past them and they would be refused), until the end."""
        self._send(final=False)

    def _send(self, final: bool) -> None:
        if self.run is None:
            return
        if not self._owned:
            self._flush_adopted()
            return
        sent = None
        for step in sorted(self._pending):
            if step > self._metric_step and not final:
                break
            if step < self._floor:
                self.num_skipped += len(self._pending.pop(step))
                continue
            self.run.log(self._pending[step], step=step)
            del self._pending[step]  # after the log: a step W&B did not take is tried again
            self._floor = sent = step
        if self._summary:
            self.run.summary.update(self._summary)
            self._summary = {}
        if sent is not None:
            self._remember(sent)

    def _flush_adopted(self) -> None:
        """Into a run prudent did not start: no ``step=`` (W&B would drop a row below the
        owner's step), prudent's step as ``prudent/step``, each key plotted against it."""
        run = self.run
        if STEP_KEY not in self._defined:
            run.define_metric(STEP_KEY)
            self._defined.add(STEP_KEY)
        for step in sorted(self._pending):
            values = self._pending[step]
            for key in values.keys() - self._defined:  # a name beats the owner's "*" glob
                run.define_metric(key, step_metric=STEP_KEY)
                self._defined.add(key)
            run.log({**values, STEP_KEY: step})
            del self._pending[step]
        if self._summary:
            run.summary.update(self._summary)
            self._summary = {}

    def close(self, status: str) -> None:
        if self.run is None:
            return
        self._send(final=True)
        if self._events:
            table = self._wandb.Table(columns=["step", "kind", "name", "message"],
                                      data=[list(event) for event in self._events])
            self.run.log({"prudent/event_table": table})
        if self.num_skipped:
            self.run.summary["prudent/num_skipped_values"] = self.num_skipped
        if self._owned:  # a run someone else started is theirs to finish
            code = self._exit_code if self._exit_code is not None else _END_EXIT_CODE.get(
                status, 0)
            self.run.finish(exit_code=code)
        self.run = None


def active_wandb_run() -> Any:
    """The W&B run the script started (``wandb.init()``), or None; None when W&B is not even
    imported (nothing is imported here)."""
    import sys

    wandb = sys.modules.get("wandb")
    return getattr(wandb, "run", None) if wandb is not None else None


def wandb_run_id(run_id: str) -> str:
    """The W&B run id for a prudent run id: the same string where W&B takes it (letters,
    digits, ``-`` and ``_``, at most 64), else a cleaned one with a short hash, still stable."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)
    if clean == run_id and len(run_id) <= 64:
        return run_id
    return f"{clean[:55]}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"


def _alerts(kind: str, name: str) -> bool:
    return kind in _ALERT_KINDS or (kind, name) == ("lifecycle", "stop_requested")
