"""RecordSync: the component that makes the run's record travel with its checkpoints.

At the start it reads the record found at the checkpoint location and merges it into this
machine's store, before the cost meter reads the spend so far and before the checkpointer
restores the model: a new machine continues the history, the restart count and the budget.
Then, on its own thread (the training thread only sets a flag when a checkpoint is saved):
after each checkpoint and every ``checkpoint.heartbeat_interval``, a segment of the rows the
store gained since the last one (if any) and a heartbeat; at the end a last segment and a
final heartbeat that says how the attempt ended. Before a checkpoint commits, its writer's
thread writes a segment too (``run.before_commit``): the bucket never holds a checkpoint
without the rows of its steps, nor without the events before it (an earlier checkpoint's
``saved`` among them). A machine that vanishes loses what its store had not committed by
its last heartbeat, never a row of a step its successor does not train again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from prudent.checkpoint.settings import CheckpointSettings
from prudent.checkpoint.storage import CheckpointStorage, default_location, open_storage
from prudent.kernel.errors import ConfigError
from prudent.kernel.events import Component, EventKind
from prudent.launch.spec import ENV_S3_ENDPOINT_URL
from prudent.record.attempt import begin_attempt, host_name
from prudent.record.format import (
    FOLDER,
    Attempt,
    Segment,
    encode_heartbeat,
    encode_segment,
    heartbeat_file,
    segment_file,
)
from prudent.record.importer import ImportResult, merge_into, read_record
from prudent.record.rows import Cursor, event_key, metric_key, newest_ids, rows_after

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["RecordSync"]

log = logging.getLogger("prudent.record")
JOURNAL_SEQ = 900_000  # the journal's segments, numbered apart from the exported ones


class RecordSync(Component):
    name = "record"
    main_rank_only = True  # rank 0 holds the store

    def __init__(self, settings: CheckpointSettings | None = None) -> None:
        self.settings = settings or CheckpointSettings()
        self.interval_s = self.settings.heartbeat_interval_s()
        self.storage: CheckpointStorage | None = None
        self.attempt = Attempt("")
        self.imported: ImportResult | None = None
        self.import_s = 0.0
        self.segment_bytes: list[int] = []  # size of each segment written, for the figures
        self.beat_s: list[float] = []  # seconds each wake of the thread took (segment + beat)
        self._cursor: Cursor = (0, 0)
        self._journals = 0
        self._backlog: tuple[list[list[Any]], list[list[Any]]] = ([], [])
        self._seq = 0
        self._wake = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failures = 0

    # events -------------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        if run.store is None:
            return
        now = time.time()
        self.attempt = Attempt(begin_attempt(run.id), host_name(), os.getpid(), now, now)
        self.storage = open_storage(self.settings.location(
            run.id, default_location(run.id, run.run_dir)))
        self.storage.check_writable()  # before anything is written there (the checkpointer's too)
        started = time.perf_counter()
        # a store locked at the start holds no row of this run yet: the record is imported at
        # the next start (merging would wait for the lock on the training thread)
        locked = getattr(run.writer, "registration_pending", False)
        storage_keys = (set(), set()) if locked else self._import(run)
        self.import_s = time.perf_counter() - started
        self._cursor = newest_ids(run.store, run.id)
        self._backlog = self._not_exported(run, storage_keys)
        run.add_component(_Finisher(self))  # last, so its on_end sees every other's record
        run.before_commit.append(lambda run: self._guarded(self._export, run))
        if hasattr(run.writer, "journal"):
            run.writer.journal = lambda metric_rows, event_rows: self._journal(
                run.id, metric_rows, event_rows)
        self._thread = threading.Thread(target=self._loop, args=(run,), daemon=True,
                                        name="prudent-record")
        self._thread.start()

    def on_checkpoint_saved(self, run: RunContext, path: str) -> None:
        self._wake.set()  # the thread writes the segment: nothing slow on the training thread

    # import -------------------------------------------------------------------------------
    def _import(self, run: RunContext) -> tuple[set[Any], set[Any]]:
        assert self.storage is not None and run.store is not None
        try:
            record = read_record(self.storage, run.id)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable storage: say so, start nothing
            raise ConfigError(f"cannot read the run record at {self.storage.url}/{FOLDER}: "
                              f"{type(exc).__name__}: {exc}. Nothing was trained: a run that "
                              "cannot read its history cannot keep its budget. Check that the "
                              "object store answers from this machine (its endpoint: "
                              f"{ENV_S3_ENDPOINT_URL}, the network, the credentials) or fix "
                              "checkpoint.url, then run the same command again") from None
        if record is None:
            return set(), set()
        self.imported = result = merge_into(run.store, run.id, record, self.attempt.id)
        if result.foreign or result.num_events or result.num_metrics:
            hosts = ", ".join(sorted({a.host for a in result.foreign})) or "this machine"
            run.record_event(
                EventKind.CHECKPOINT, "record_imported",
                f"imported the run's record from {self.storage.url}/{FOLDER}: {len(result.foreign)} "
                f"earlier attempt(s) on {hosts}, {result.num_events} events, {result.num_metrics} "
                f"metrics; ${result.total_usd:.2f} spent so far, {result.restarts} restart(s)",
                attempts=[a.id for a in result.foreign], lost=[a.id for a in result.lost],
                events=result.num_events, metrics=result.num_metrics,
                total_usd=result.total_usd, restarts=result.restarts, bytes=record.num_bytes)
        return record.keys()

    def _not_exported(self, run: RunContext, storage_keys: tuple[set[Any], set[Any]]
                      ) -> tuple[list[list[Any]], list[list[Any]]]:
        """Rows this store had before now that no segment holds (an earlier attempt on this
        machine that died between checkpoints): they go out with the first segment."""
        events, metrics, _ = rows_after(run.store, run.id, (0, 0), upto=self._cursor)  # type: ignore[arg-type]
        return ([r for r in events if event_key(r) not in storage_keys[0]],
                [r for r in metrics if metric_key(r) not in storage_keys[1]])

    # export -------------------------------------------------------------------------------
    def _loop(self, run: RunContext) -> None:
        # the first beat once the components after this one have started (the meter's price)
        self._done.wait(min(self.interval_s or 1.0, 1.0))
        self._guarded(self._beat, run)
        while not self._done.is_set():
            self._wake.wait(self.interval_s)  # a checkpoint was saved, or it is time to beat
            if self._done.is_set():
                return
            self._wake.clear()
            started = time.perf_counter()
            self._guarded(self._export, run)  # nothing when no row arrived since the last
            self._guarded(self._beat, run)
            self.beat_s.append(time.perf_counter() - started)

    def finish(self, run: RunContext, status: str, reason: StopReason | None) -> None:
        """The last segment and the final heartbeat (called after every other on_end)."""
        self._done.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.attempt.status = status
        self.attempt.stop_reason = str(reason) if reason is not None else None
        self._guarded(self._export, run)
        self._guarded(self._beat, run)

    def _guarded(self, write: Any, run: RunContext) -> None:
        try:
            with self._lock:
                write(run)
        except Exception as exc:  # noqa: BLE001 - the record must never take training down
            self._failures += 1
            if self._failures == 1:
                log.warning("prudent could not write the run record to %s (%s); training goes "
                            "on", self.storage.url if self.storage else "?", exc)

    def _export(self, run: RunContext) -> None:
        assert self.storage is not None and run.store is not None
        run.writer.flush(timeout_s=10.0)  # the 'saved' event just recorded goes out with it
        events, metrics, cursor = rows_after(run.store, run.id, self._cursor)
        events, metrics = self._backlog[0] + events, self._backlog[1] + metrics
        if not events and not metrics:
            return
        stored = run.store.get_run(run.id) or {}
        segment = Segment(run.id, self._snapshot(run), self._seq,
                          {"name": stored.get("name"), "started_at": stored.get("started_at"),
                           "command": stored.get("command")}, events, metrics)
        data = encode_segment(segment)
        self.storage.put(FOLDER, segment_file(self.attempt.id, self._seq), data)
        self.segment_bytes.append(len(data))
        self._cursor, self._backlog, self._seq = cursor, ([], []), self._seq + 1

    def _journal(self, run_id: str, metric_rows: list[dict[str, Any]],
                 event_rows: list[dict[str, Any]]) -> None:
        """Rows the store never took (the writer's, on its thread), as one more segment of
        this attempt: the next start's import adds them to the store (rows already there, if
        it took them after all, are skipped by their keys)."""
        assert self.storage is not None
        with self._lock:
            self._journals += 1
            segment = Segment(
                run_id, Attempt(**vars(self.attempt)), JOURNAL_SEQ + self._journals, {},
                [[r["step"], r["kind"], r["name"], r["message"], r["payload"], r["wall"]]
                 for r in event_rows],
                [[r["step"], r["name"], r["value"], r["wall"]] for r in metric_rows])
            self.storage.put(FOLDER, segment_file(self.attempt.id, segment.seq),
                             encode_segment(segment))

    def _beat(self, run: RunContext) -> None:
        assert self.storage is not None
        self.storage.put(FOLDER, heartbeat_file(self.attempt.id),
                         encode_heartbeat(run.id, self._snapshot(run)))

    def _snapshot(self, run: RunContext) -> Attempt:
        """The attempt now: spend from the cost meter's published price (exact to the second)."""
        now, attempt, gauges = time.time(), self.attempt, run.gauges
        attempt.last_seen, attempt.step = now, run.state.step
        attempt.hourly_usd = float(gauges.get("cost_hourly_usd", 0.0))
        since, prior = gauges.get("cost_started_at", attempt.started_at), gauges.get("cost_prior_usd", 0.0)
        attempt.attempt_usd = attempt.hourly_usd * max(0.0, now - since) / 3600
        attempt.total_usd = prior + attempt.attempt_usd
        if "cost_final_usd" in gauges:  # the meter has ended: its figure, to the cent
            attempt.total_usd = gauges["cost_final_usd"]
            attempt.attempt_usd = attempt.total_usd - prior
        return Attempt(**vars(attempt))


class _Finisher(Component):
    """Registered by RecordSync at the start, so that its on_end comes after every other's."""

    name = "record_end"

    def __init__(self, sync: RecordSync) -> None:
        self.sync = sync

    def on_end(self, run: RunContext, status: str, reason: StopReason | None) -> None:
        self.sync.finish(run, status, reason)
