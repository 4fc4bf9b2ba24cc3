"""CsvLoggerSink: prudent's rows in a Lightning ``CSVLogger``'s ``metrics.csv``.

A CSV holds numbers per step: prudent's metrics (``prudent/<name>``), a marker
``prudent/event/<kind>`` = 1 at each event's step, the profile's summary numbers
(``prudent/profile/*``) and ``prudent/cost_usd`` at the end. Event messages and the verdict
are text: they go to the other trackers, not into a column of numbers.

The CSVLogger's writer is not thread-safe (its ``save`` rewrites the file and resets its row
list), so this sink never touches it from the tracking thread: it puts each step's row in a
hand-over queue that the training thread empties (:meth:`deliver`, between two steps, where
Lightning itself logs), one ``log_metrics`` call per step.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from prudent.tracking.base import Row, RunInfo, TrackerSink, event_payload

__all__ = ["CsvLoggerSink"]


class CsvLoggerSink(TrackerSink):
    name = "csv"

    def __init__(self, logger: Any, info: RunInfo, metric_prefix: str = "") -> None:
        self.logger = logger
        self.info = info
        self.metric_prefix = metric_prefix
        self.target = f"csv:{logger.log_dir}"
        self._pending: dict[int, dict[str, float]] = {}  # the tracking thread's
        self._ready: deque[tuple[int, dict[str, float]]] = deque()  # for the training thread

    def write_metrics(self, rows: list[Row]) -> None:
        for row in rows:
            if row["value"] is not None:
                self._at(row["step"])[self.metric_prefix + row["name"]] = row["value"]

    def write_events(self, rows: list[Row]) -> None:
        for row in rows:
            values = self._at(row["step"])
            values[f"prudent/event/{row['kind']}"] = 1.0
            if (row["kind"], row["name"]) == ("profile", "summary"):
                values.update({f"prudent/profile/{k}": v for k, v in event_payload(row).items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool)})

    def write_summary(self, summary: dict[str, Any]) -> None:
        if summary.get("cost_usd") is not None:
            self._at(summary["step"])["prudent/cost_usd"] = float(summary["cost_usd"])

    def _at(self, step: int) -> dict[str, float]:
        return self._pending.setdefault(step, {})

    def flush(self) -> None:
        for step in sorted(self._pending):
            self._ready.append((step, self._pending.pop(step)))

    def close(self, status: str) -> None:
        self.flush()

    def deliver(self) -> None:
        """On the training thread: the rows handed over so far into the logger (Lightning
        writes them to ``metrics.csv`` at its next save, or when it finalizes the logger)."""
        ready = self._ready
        while ready:
            step, values = ready.popleft()
            self.logger.log_metrics(values, step)
