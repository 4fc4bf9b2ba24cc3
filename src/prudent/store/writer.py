"""The store's writer: metrics and events go to the store from a background thread, in
batches, so the training loop never waits for a database (and never fails because of one)."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from sqlalchemy.exc import InterfaceError, OperationalError

from prudent.kernel.errors import StoreLocked, StoreUnavailable
from prudent.kernel.events import EventKind
from prudent.store.database import LOCKED_WAIT_S, Store, describe_error

__all__ = ["NullWriter", "StoreWriter", "WriterListener", "event_signature", "to_floats"]

log = logging.getLogger("prudent.store")
_KEPT_EVENTS = 200  # events a rank other than 0 holds between two agreements, newest kept


class StoreWriter:
    """Writes metrics and events from a background thread, in batches.

    ``put_metrics`` takes values that may still be tensors (on any device): they are turned
    into floats here, off the training thread, one stacked transfer per device per batch.
    Errors never reach the training loop. While the database cannot be reached (a PostgreSQL
    server restarting, a network cut) the rows are kept, at most ``max_buffered_rows``, and
    written when it answers again; past that bound the oldest metric rows are dropped, counted
    in ``num_dropped`` and the log says exactly how many. A batch the database refuses for
    its content is dropped and counted the same way, so it cannot block the rows behind it.
    """

    def __init__(self, store: Store, flush_interval_s: float = 0.5,
                 max_buffered_rows: int = 200_000,
                 registration: Callable[[], None] | None = None) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self.max_buffered_rows = max_buffered_rows
        self.latest: dict[str, float] = {}
        self.num_errors = 0
        self.num_dropped = 0
        self._outage_since: float | None = None
        self._outage_began_wall = 0.0
        self._dropped_in_outage = 0
        self._last_row: tuple[str, int] | None = None  # (run id, step) of the newest row queued
        # (kind, name, message) of the newest events: another rank's copy of one of
        # them is not recorded again (see prudent.distributed.torchrun.StopCoordinator)
        self.recent_events: deque[tuple[Any, ...]] = deque(maxlen=_KEPT_EVENTS)
        self._listeners: list[WriterListener] = []
        # where rows the store never took go instead of being lost (the run's record beside
        # its checkpoints: ``prudent.record.sync``); None: they are dropped, counted
        self.journal: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None] | None = None
        # store calls made from this thread, in order, before the rows: the run's
        # registration when the store was locked at its start (the rows wait behind it),
        # then whatever ``call_soon`` was given
        self._calls: list[Callable[[], Any]] = [registration] if registration else []
        self._registration = registration
        self._registration_since = time.monotonic()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._loop, name="prudent-store-writer", daemon=True)
        self._thread.start()

    def put_metrics(self, run_id: str, steps: list[tuple[int, float, dict[str, Any]]],
                    latest: bool = True) -> None:
        """``steps``: ``(step, wall time, {name: number or tensor})`` tuples. ``latest=False``:
        kept out of :attr:`latest` (``run.latest``, the console's summary): series that
        describe the machine, not the model."""
        self._idle.clear()
        if steps:
            self._last_row = (run_id, steps[-1][0])
        self._queue.put(("metrics", run_id, steps, latest))

    def put_event(self, row: dict[str, Any]) -> None:
        self._idle.clear()
        self._last_row = (row["run_id"], row["step"])
        self.recent_events.append(event_signature(row))
        self._queue.put(("event", row))

    @property
    def registration_pending(self) -> bool:
        """The run is not in the store yet: it was locked when the run started."""
        return self._registration is not None

    def call_soon(self, call: Callable[[], Any]) -> None:
        """``call(…)`` on the store from this writer's thread, after what was queued before
        (the training thread never waits for the store's lock)."""
        self._idle.clear()
        self._queue.put(("call", call))

    def add_listener(self, listener: WriterListener) -> None:
        """Also hand every metric row (as floats) and event to ``listener`` (the experiment
        trackers), from this writer's thread; it is closed after the writer."""
        self._listeners.append(listener)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until everything queued so far is committed, or one try failed."""
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is left; an unreachable store is retried until ``timeout_s``."""
        if self._thread.is_alive():
            self._queue.put(("stop", time.monotonic() + max(0.0, timeout_s - 1.0)))
            self._thread.join(timeout_s)
        close_listeners(self._listeners)

    def _loop(self) -> None:
        rows: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
        deadline = time.monotonic() + self.flush_interval_s
        stop_by: float | None = None
        while stop_by is None or (rows[0] or rows[1] or self._calls) and self._waits_on(stop_by):
            waiters: list[threading.Event] = []
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                stop_by = self._take(item, rows, waiters) or stop_by
                while True:  # drain whatever else is already queued
                    stop_by = self._take(self._queue.get_nowait(), rows, waiters) or stop_by
            except queue.Empty:
                pass
            if waiters or stop_by is not None or time.monotonic() >= deadline:
                self._commit(*rows)
                deadline = time.monotonic() + self.flush_interval_s
            for waiter in waiters:
                waiter.set()
        if rows[0] or rows[1]:
            self._drop(rows, len(rows[0]), len(rows[1]), "the run store stayed unreachable "
                       "until the run ended", final=True, unreachable=True)
        if self._registration is not None:
            log.warning("prudent: the run store %s stayed locked until the run ended: the run "
                        "is registered from its record beside the checkpoints when it starts "
                        "again (or by `prudent store repair`)", self.store.url)

    def _waits_on(self, stop_by: float) -> bool:
        """Whether the run's end still waits for the store: until ``stop_by``, or less once a
        server found away has had the time the store gives it (its calls fail at once then:
        waiting on would only delay the run's exit)."""
        wait_left_s = getattr(self.store, "wait_left_s", None)  # a store without a server: none
        left = wait_left_s() if wait_left_s is not None else None
        return time.monotonic() < stop_by and (left is None or left > 0)

    def _take(self, item: tuple[Any, ...], rows: tuple[list[dict[str, Any]], list[dict[str, Any]]],
              waiters: list[threading.Event]) -> float | None:
        kind = item[0]
        if kind == "metrics":
            new_rows = self._metric_rows(item[1], item[2], item[3])
            rows[0].extend(new_rows)
            self._tell(new_rows, [])
        elif kind == "event":
            rows[1].append(item[1])
            self._tell([], [item[1]])
        elif kind == "flush":
            waiters.append(item[1])
        elif kind == "call":
            self._calls.append(item[1])
        excess = len(rows[0]) + len(rows[1]) - self.max_buffered_rows
        if excess > 0:
            self._drop(rows, min(excess, len(rows[0])), max(0, excess - len(rows[0])),
                       f"more than {self.max_buffered_rows} rows waited for the run store",
                       unreachable=True)
        if kind != "stop":
            return None
        # a run never registered (the store locked since its start) waits a little for the
        # lock, not the whole close: its rows go to the record, imported at the next start
        return min(item[1], time.monotonic() + LOCKED_WAIT_S) if self._registration else item[1]

    def _tell(self, metric_rows: list[dict[str, Any]], event_rows: list[dict[str, Any]]) -> None:
        for listener in self._listeners:
            try:
                listener.take(metric_rows, event_rows)
            except Exception as exc:  # a listener's bug must not stop the store's rows
                self._report(exc)

    def _metric_rows(self, run_id: str, steps: list[tuple[int, float, dict[str, Any]]],
                     latest: bool) -> list[dict[str, Any]]:
        try:
            values = to_floats([v for _, _, m in steps for v in m.values()])
        except Exception as exc:  # a bad metric must not kill the writer
            self._report(exc)
            return []
        rows, index = [], 0
        for step, wall, named in steps:
            for name in named:
                rows.append({"run_id": run_id, "step": step, "name": name,
                             "value": values[index], "wall": wall})
                if latest:
                    self.latest[name] = values[index]
                index += 1
        return rows

    def _calls_done(self) -> bool:
        """The queued store calls, in order; False while one must wait (the store locked, or
        away): the rows wait behind it, as in an outage."""
        while self._calls:
            call = self._calls[0]
            try:  # a store locked at the run's start: tried at each flush, not waited on
                with self.store.waiting_at_most(
                        max(0.5, self.flush_interval_s) if self._registration else None):
                    call()
            except StoreLocked:
                return False
            except (StoreUnavailable, OperationalError, InterfaceError) as exc:
                self._outage(exc)
                return False
            except Exception as exc:  # noqa: BLE001 - refused for what it asked: not again
                self._report(exc)
            self._calls.pop(0)
            if call is self._registration:
                self._registration = None
                log.warning("prudent: the run store %s is free again after %.0f s: the run is "
                            "registered and its rows are written", self.store.url,
                            time.monotonic() - self._registration_since)
        return True

    def _commit(self, metric_rows: list[dict[str, Any]], event_rows: list[dict[str, Any]]) -> None:
        if not self._calls_done():
            return
        try:
            self.store.add_records(metric_rows, event_rows)
        except (StoreUnavailable, OperationalError, InterfaceError) as exc:  # unreachable: keep
            # them, try again
            self._outage(exc)
            return
        except Exception as exc:  # refused for what they hold: retrying would block the rest
            self._report(exc)
            self._drop((metric_rows, event_rows), len(metric_rows), len(event_rows),
                       "the run store refused the batch")
        self._recovered(len(metric_rows) + len(event_rows))
        del metric_rows[:], event_rows[:]

    def _drop(self, rows: tuple[list[dict[str, Any]], list[dict[str, Any]]], num_metrics: int,
              num_events: int, why: str, final: bool = False, unreachable: bool = False) -> None:
        """Rows out of the buffer: into the journal when the store could not be reached (not
        when it refused them: they would be refused again), else dropped and counted."""
        metric_rows, event_rows = rows[0][:num_metrics], rows[1][:num_events]
        del rows[0][:num_metrics], rows[1][:num_events]
        if unreachable and self.journal is not None and (metric_rows or event_rows):
            try:
                self.journal(metric_rows, event_rows)
            except Exception as exc:  # noqa: BLE001 - the journal failed too: counted below
                log.warning("prudent: the run's journal could not be written either (%s)", exc)
            else:
                log.warning("prudent: %d metric rows and %d events the run store did not take "
                            "(%s) are kept in the run's record beside its checkpoints; the "
                            "next start imports them", len(metric_rows), len(event_rows), why)
                return
        first_in_outage = self._outage_since is not None and not self._dropped_in_outage
        self.num_dropped += num_metrics + num_events
        self._dropped_in_outage += num_metrics + num_events
        if self._outage_since is None or first_in_outage or final:
            # during an outage: once here, the exact count when it ends
            log.warning("prudent: dropped %d metric rows and %d events (%d rows in all): %s",
                        num_metrics, num_events, self.num_dropped, why)

    def _outage(self, exc: BaseException) -> None:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self._outage_began_wall = time.time()
            self._dropped_in_outage = 0
            self.num_errors += 1
            log.warning("prudent: cannot write to the run store %s (%s); training goes on and "
                        "up to %d rows wait until it answers again", self.store.url,
                        describe_error(exc), self.max_buffered_rows)

    def _recovered(self, num_rows: int) -> None:
        if self._outage_since is not None:
            outage_s = time.monotonic() - self._outage_since
            log.warning("prudent: the run store %s answers again after %.1f s: %d waiting rows "
                        "written, %d dropped", self.store.url, outage_s, num_rows,
                        self._dropped_in_outage)
            self._outage_since = None
            self._record_outage(outage_s, num_rows)

    def _record_outage(self, outage_s: float, num_rows: int) -> None:
        """The outage in the run's own record, not only in a log that dies with the machine:
        whoever reads the curves later learns why some rows may be missing."""
        if self._last_row is None:
            return
        run_id, step = self._last_row
        message = (f"the run store could not be reached for {outage_s:.1f} s: {num_rows} rows "
                   f"waited and were written, {self._dropped_in_outage} dropped")
        payload = {"seconds": round(outage_s, 3), "rows_written": num_rows,
                   "rows_dropped": self._dropped_in_outage}
        try:
            self.store.add_records([], [{
                "run_id": run_id, "step": step, "kind": EventKind.STORE.value, "name": "outage",
                "message": message, "payload": json.dumps(payload),
                "wall": self._outage_began_wall}])
        except Exception as exc:  # it answered a moment ago; if not now, the log has it
            self._report(exc)

    def _report(self, exc: BaseException) -> None:
        self.num_errors += 1
        if self.num_errors == 1:
            log.warning("prudent: could not write to the run store (%s); training goes on",
                        describe_error(exc))


class WriterListener(Protocol):
    """What :meth:`StoreWriter.add_listener` takes: ``take`` runs on the writer's thread and
    must not block (queue the rows and return); ``close`` ends it once the writer is done."""

    def take(self, metric_rows: list[dict[str, Any]], event_rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


def close_listeners(listeners: list[WriterListener]) -> None:
    for listener in listeners:
        try:
            listener.close()
        except Exception as exc:  # the run's end goes on
            log.warning("prudent: a store writer listener failed to close: %s", exc)
    listeners.clear()


def event_signature(row: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one event from another whichever rank recorded it: not the step (each rank
    says "loss_not_decreasing cannot judge this run" at its own first check); a rule's message
    names its step."""
    return row["kind"], row["name"], row["message"]


class NullWriter:
    """A StoreWriter for torchrun ranks other than 0: it writes nothing, and holds its newest
    events (at most ``_KEPT_EVENTS``) until rank 0 takes them into the record at the ranks'
    next agreement (:meth:`take_events`, see ``prudent.distributed.torchrun``): a rule that
    fires on this rank alone, or the failure bundle it writes, is in the run's record too."""

    num_errors = 0

    def __init__(self) -> None:
        self.latest: dict[str, float] = {}
        self._listeners: list[WriterListener] = []
        self._events: deque[dict[str, Any]] = deque(maxlen=_KEPT_EVENTS)

    @property
    def holds_events(self) -> bool:
        return bool(self._events)

    def take_events(self) -> list[dict[str, Any]]:
        """The events put since the last call, oldest first."""
        events = list(self._events)
        self._events.clear()
        return events

    def add_listener(self, listener: WriterListener) -> None:
        self._listeners.append(listener)  # told nothing; closed with the writer

    def put_metrics(self, run_id: str, steps: list[tuple[int, float, dict[str, Any]]],
                    latest: bool = True) -> None:
        pass

    def put_event(self, row: dict[str, Any]) -> None:
        self._events.append(row)

    def call_soon(self, call: Callable[[], Any]) -> None:
        pass

    def flush(self, timeout_s: float = 30.0) -> None:
        pass

    def close(self, timeout_s: float = 30.0) -> None:
        close_listeners(self._listeners)


def to_floats(values: Iterable[Any]) -> list[float | None]:
    """Numbers and 0-d tensors to floats, with one host transfer per device (not per value)."""
    values = list(values)
    out: list[float | None] = [None] * len(values)
    by_device: dict[Any, list[int]] = {}
    for i, value in enumerate(values):
        if hasattr(value, "detach") and hasattr(value, "device"):
            by_device.setdefault(value.device, []).append(i)
        else:
            out[i] = None if value is None else float(value)
    if by_device:
        import torch

        for indices in by_device.values():
            stacked = torch.stack([values[i].detach().reshape(()).float() for i in indices])
            for i, number in zip(indices, stacked.tolist()):
                out[i] = number
    return out
