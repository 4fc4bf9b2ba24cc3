"""TrackingDispatcher: hands the store writer's rows to the trackers from a thread of its own.

The store writer's thread (which has already turned tensors into floats) calls :meth:`take`,
which only appends to a queue, so a slow tracker slows neither training nor the store. Each
tracker keeps its own backlog: a tracker that is down or raises keeps its rows (at most
``max_buffered_rows``; past that the oldest are dropped, counted in ``num_dropped`` and
logged) and is tried again a little later; the others go on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from prudent.tracking.base import TrackerRefused, TrackerSink

__all__ = ["TrackingDispatcher"]

log = logging.getLogger("prudent.tracking")

_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # waits between tries of a tracker that failed


class _Slot:
    """One tracker, its backlog ``(kind, data, num_rows)`` and its health."""

    def __init__(self, sink: TrackerSink) -> None:
        self.sink = sink
        self.backlog: deque[tuple[str, Any, int]] = deque()
        self.num_rows = 0
        self.opened = False
        self.failures = 0  # consecutive
        self.retry_at = 0.0
        self.num_dropped = 0
        self.num_errors = 0


class TrackingDispatcher:
    """The writer's listener: ``take`` (writer thread), ``put`` (any thread), ``close``."""

    def __init__(self, sinks: list[TrackerSink], flush_interval_s: float = 1.0,
                 max_buffered_rows: int = 50_000, close_timeout_s: float = 10.0) -> None:
        self.slots = [_Slot(sink) for sink in sinks]
        self.close_timeout_s = close_timeout_s
        self.flush_interval_s = flush_interval_s
        self.max_buffered_rows = max_buffered_rows
        self.status = "completed"  # the run's, for the trackers' end (set by the component)
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prudent-tracking", daemon=True)
        self._thread.start()

    @property
    def num_dropped(self) -> int:
        return sum(slot.num_dropped for slot in self.slots)

    # producers ------------------------------------------------------------------------------
    def take(self, metric_rows: list[dict[str, Any]], event_rows: list[dict[str, Any]]) -> None:
        """From the store writer's thread: rows as the store gets them. Never blocks."""
        if metric_rows:
            self._queue.put(("metrics", metric_rows))
        if event_rows:
            self._queue.put(("events", event_rows))

    def add_sink(self, sink: TrackerSink, first: list[tuple[str, Any]]) -> None:
        """A tracker that joins a run under way: it gets ``first`` (what it missed that it
        needs: the config), then every row from now on."""
        self._queue.put(("sink", (sink, first)))

    def put(self, kind: str, data: Any) -> None:
        """``config`` (a dict) or ``summary`` (a dict), from any thread."""
        self._queue.put((kind, data))

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is left, trying a tracker that is down until ``timeout_s`` (default
        ``close_timeout_s``), then end the trackers' runs; what was not sent is dropped and
        counted."""
        timeout_s = self.close_timeout_s if timeout_s is None else timeout_s
        if self._thread.is_alive():
            self._deadline = time.monotonic() + max(0.0, timeout_s - 0.5)
            self._closing.set()
            self._queue.put(("wake", None))
            self._thread.join(timeout_s + 1.0)

    # the tracking thread --------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closing.is_set():
            self._drain(timeout_s=self.flush_interval_s)
            self._deliver_all()
        self._drain(timeout_s=0.0)
        while any(s.backlog for s in self.slots) and time.monotonic() < self._deadline:
            self._deliver_all()
            time.sleep(0.5)
        for slot in self.slots:
            self._end(slot)

    def _drain(self, timeout_s: float) -> None:
        try:
            item = self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get_nowait()
            while True:
                self._add(*item)
                item = self._queue.get_nowait()
        except queue.Empty:
            pass

    def _add(self, kind: str, data: Any) -> None:
        if kind == "wake":
            return
        if kind == "sink":
            sink, first = data
            slot = _Slot(sink)
            slot.backlog.extend((k, d, 1) for k, d in first)
            slot.num_rows = len(first)
            self.slots.append(slot)
            return
        num_rows = len(data) if kind in ("metrics", "events") else 1
        for slot in self.slots:
            slot.backlog.append((kind, data, num_rows))
            slot.num_rows += num_rows
            if slot.num_rows > self.max_buffered_rows:
                self._trim(slot)

    def _trim(self, slot: _Slot) -> None:
        dropped = 0
        while slot.num_rows > self.max_buffered_rows and slot.backlog:
            _, _, num_rows = slot.backlog.popleft()
            slot.num_rows -= num_rows
            dropped += num_rows
        self._dropped(slot, dropped, f"more than {self.max_buffered_rows} rows waited for it")

    def _dropped(self, slot: _Slot, num_rows: int, why: str) -> None:
        if num_rows:
            first = slot.num_dropped == 0
            slot.num_dropped += num_rows
            if first or not slot.backlog:
                log.warning("prudent: dropped %d rows for %s (%d in all): %s", num_rows,
                            slot.sink.name, slot.num_dropped, why)

    def _deliver_all(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.backlog and (now >= slot.retry_at or self._closing.is_set()):
                self._deliver(slot)

    def _deliver(self, slot: _Slot) -> None:
        try:
            if not slot.opened:
                slot.sink.open()
                slot.opened = True
            while slot.backlog:
                kind, data, num_rows = slot.backlog[0]
                try:
                    getattr(slot.sink, f"write_{kind}")(data)
                except TrackerRefused as exc:
                    slot.num_errors += 1
                    self._dropped(slot, num_rows, f"{slot.sink.name} refused them: {exc}")
                slot.backlog.popleft()
                slot.num_rows -= num_rows
            slot.sink.flush()
        except Exception as exc:  # the tracker is down or refused: keep the rows, try later
            self._failed(slot, exc)
            return
        if slot.failures:
            log.warning("prudent: %s answers again after %d failed tries", slot.sink.name,
                        slot.failures)
        slot.failures = 0

    def _failed(self, slot: _Slot, exc: BaseException) -> None:
        slot.num_errors += 1
        if slot.failures == 0:
            log.warning("prudent: cannot write to %s (%s: %s); training goes on and up to %d "
                        "rows wait for it", slot.sink.name, type(exc).__name__, exc,
                        self.max_buffered_rows)
        slot.retry_at = time.monotonic() + _RETRY_S[min(slot.failures, len(_RETRY_S) - 1)]
        slot.failures += 1

    def _end(self, slot: _Slot) -> None:
        self._dropped(slot, slot.num_rows, "it could not be reached before the run ended")
        slot.backlog.clear()
        try:
            slot.sink.close(self.status)
        except Exception as exc:
            log.warning("prudent: could not close %s: %s: %s", slot.sink.name,
                        type(exc).__name__, exc)
