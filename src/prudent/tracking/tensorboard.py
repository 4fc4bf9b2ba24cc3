"""TensorBoardSink: event files under ``<logdir>/<run id>``, continued on resume.

Metrics are scalars under their own names. Each prudent event is a text entry
(``prudent/events``) and a scalar ``prudent/event/<kind>`` set to 1 at its step, a mark on
the curves' step axis. The run's config is a markdown table (``prudent/config``), the end a
text (``prudent/summary``) and scalars (``prudent/cost_usd``).

Resume: when the run's folder already holds event files, the writer is opened with
``purge_step`` at the first step this attempt trains (the one after the checkpoint it resumed
from, or the first step it writes when it resumed from none), so TensorBoard drops what the
previous attempt wrote from there on (steps done again after a kill) and the curve stays one
line. A row this attempt writes at an earlier step (an evaluation the script does again at
the checkpoint's step) never purges what came before it: TensorBoard's purge takes every tag
at once.
"""

from __future__ import annotations

from typing import Any

from prudent.tracking.base import Row, RunInfo, TrackerSink, event_payload, event_text, require
from prudent.tracking.settings import TensorBoardSettings

__all__ = ["TensorBoardSink", "is_summary_writer"]


class TensorBoardSink(TrackerSink):
    name = "tensorboard"
    _resumed_at: int | None = None  # the step of the checkpoint this attempt resumed from

    def __init__(self, settings: TensorBoardSettings, info: RunInfo) -> None:
        tensorboard = require("torch.utils.tensorboard", "tensorboard")
        self._writer_class = tensorboard.SummaryWriter
        self.logdir = f"{settings.logdir.rstrip('/')}/{info.run_id}"
        self.info = info
        self._writer: Any = None
        self._owned = True  # prudent opened the writer: it closes it
        self._purge = True  # a relaunch purges the steps it does again
        self._waiting: list[tuple[str, Any]] = []  # written once the first metric sets purge_step

    @classmethod
    def around(cls, writer: Any, info: RunInfo, metric_prefix: str = "") -> TensorBoardSink:
        """The script's own ``SummaryWriter`` (``run.attach(tb=writer)``, Lightning's
        ``TensorBoardLogger.experiment``): prudent writes into it beside the script's scalars,
        flushes it, and leaves closing it to its owner."""
        sink = cls.__new__(cls)
        sink.logdir, sink.info, sink._writer, sink._owned = writer.log_dir, info, writer, False
        sink._waiting, sink.metric_prefix = [], metric_prefix
        sink.target = f"tensorboard:{writer.log_dir}"
        return sink

    @classmethod
    def beside(cls, logdir: str, info: RunInfo, metric_prefix: str = "") -> TensorBoardSink:
        """An event file of prudent's own in a run folder another writer fills (the HF
        Trainer's, which closes its writer before prudent's end is written): TensorBoard
        shows both as one run. Never purged (that would drop the other writer's steps)."""
        sink = cls(TensorBoardSettings(), info)  # opened on the tracking thread, as any
        sink.logdir, sink._purge = logdir, False
        sink.metric_prefix, sink.target = metric_prefix, f"tensorboard:{logdir}"
        return sink

    def _open_writer(self, first_step: int | None) -> Any:
        if self._writer is None:
            if self._resumed_at is not None:
                first_step = self._resumed_at + 1
            purge = first_step if (self._purge and first_step is not None
                                   and _has_events(self.logdir)) else None
            self._writer = self._writer_class(self.logdir, purge_step=purge, flush_secs=30)
            waiting, self._waiting = self._waiting, []
            for kind, data in waiting:
                getattr(self, f"write_{kind}")(data)
        return self._writer

    def write_metrics(self, rows: list[Row]) -> None:
        if not rows:
            return
        writer = self._open_writer(min(row["step"] for row in rows))
        prefix = self.metric_prefix
        for row in rows:
            if row["value"] is not None:
                writer.add_scalar(prefix + row["name"], row["value"], row["step"],
                                  walltime=row["wall"])

    def write_events(self, rows: list[Row]) -> None:
        if self._writer is None:
            self._waiting.append(("events", rows))
            self._resumed_at = next((row["step"] for row in rows if (row["kind"], row["name"])
                                     == ("checkpoint", "resumed")), self._resumed_at)
            return
        for row in rows:
            step, wall = row["step"], row["wall"]
            self._writer.add_text("prudent/events", event_text(row), step, walltime=wall)
            self._writer.add_scalar(f"prudent/event/{row['kind']}", 1.0, step, walltime=wall)
            if (row["kind"], row["name"]) == ("profile", "summary"):
                self._profile(event_payload(row), step, wall)

    def _profile(self, payload: dict[str, Any], step: int, wall: float) -> None:
        for key, value in payload.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(f"prudent/profile/{key}", value, step, walltime=wall)

    def write_config(self, config: dict[str, Any]) -> None:
        if self._writer is None:
            self._waiting.append(("config", config))
            return
        from prudent.tracking.base import flat_params

        table = "| key | value |\n|---|---|\n" + "\n".join(
            f"| {k} | {v} |" for k, v in sorted(flat_params(config).items()))
        self._writer.add_text("prudent/config", table, 0)

    def write_summary(self, summary: dict[str, Any]) -> None:
        writer = self._open_writer(None)
        step = summary["step"]
        lines = "\n".join(f"- **{k}**: {v}" for k, v in summary.items() if v is not None)
        writer.add_text("prudent/summary", lines, step)
        if summary.get("cost_usd") is not None:
            writer.add_scalar("prudent/cost_usd", summary["cost_usd"], step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self, status: str) -> None:
        if self._writer is None and self._waiting:
            self._open_writer(None)
        if self._writer is not None:
            self._writer.close() if self._owned else self._writer.flush()


def is_summary_writer(obj: Any) -> bool:
    """A TensorBoard ``SummaryWriter`` (torch's or tensorboardX's), without importing either."""
    kind = type(obj)
    return kind.__name__ == "SummaryWriter" and kind.__module__.startswith(
        ("torch.utils.tensorboard", "tensorboardX"))


def _has_events(logdir: str) -> bool:
    """Event files from an earlier attempt of this run (a local folder or an fsspec URL)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(logdir)
    try:
        return any("tfevents" in name for name in fs.ls(path, detail=False))
    except FileNotFoundError:
        return False
