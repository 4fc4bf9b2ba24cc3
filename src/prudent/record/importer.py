"""Reading the record that travelled with the checkpoints, and merging it into this store.

Merging is idempotent: an event is the same event on every machine when its step, kind, name
and wall time are (a metric: step, name, wall time), so rows already here are skipped, and an
attempt already known here (by the id in its ``cost/price`` event) is not counted again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from prudent.checkpoint.storage import CheckpointStorage
from prudent.kernel.events import EventKind
from prudent.record.format import (
    FOLDER,
    Attempt,
    Segment,
    decode_heartbeat,
    decode_segment,
    is_heartbeat,
    is_segment,
)
from prudent.record.rows import event_key, local_keys, metric_key
from prudent.store.database import Store

__all__ = ["ImportResult", "Record", "merge_into", "read_record"]


@dataclass
class Record:
    """Every segment and heartbeat found, already checked."""

    run_id: str
    segments: list[Segment] = field(default_factory=list)
    attempts: dict[str, Attempt] = field(default_factory=dict)  # each attempt's latest word
    num_bytes: int = 0

    @property
    def total_usd(self) -> float:
        return max((a.total_usd for a in self.attempts.values()), default=0.0)

    def keys(self) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
        return ({event_key(r) for s in self.segments for r in s.events},
                {metric_key(r) for s in self.segments for r in s.metrics})

    def started_at(self) -> float | None:
        found = [s.run["started_at"] for s in self.segments if s.run.get("started_at")]
        return min(found) if found else None

    def _saw(self, attempt: Attempt) -> None:
        known = self.attempts.get(attempt.id)
        if known is None or (attempt.last_seen, attempt.status is not None) >= (
                known.last_seen, known.status is not None):
            self.attempts[attempt.id] = attempt


@dataclass
class ImportResult:
    num_events: int
    num_metrics: int
    foreign: list[Attempt]  # attempts on other machines, new to this store
    lost: list[Attempt]  # of those, the ones that never ended cleanly
    total_usd: float
    restarts: int


def read_record(storage: CheckpointStorage, run_id: str) -> Record | None:
    """The record at ``storage`` (None when there is none); ConfigError when any part of it is
    unreadable or belongs to another run."""
    files = sorted(storage.files(FOLDER))
    if not files:
        return None
    record = Record(run_id)
    wanted = [f for f in files if is_segment(f) or is_heartbeat(f)]
    contents = storage.read_many(FOLDER, wanted)
    for filename in wanted:
        where = f"{storage.url}/{FOLDER}/{filename}"
        # listed but gone or unreadable: refused below like any damaged file
        data = contents.get(filename) or b""
        record.num_bytes += len(data)
        if is_segment(filename):
            segment = decode_segment(data, run_id, where)
            record.segments.append(segment)
            record._saw(segment.attempt)
        else:
            record._saw(decode_heartbeat(data, run_id, where))
    return record


def merge_into(store: Store, run_id: str, record: Record, current: str) -> ImportResult:
    """Add what ``record`` has and this store lacks; count the other machines' attempts."""
    run = store.get_run(run_id) or {}
    known_events, known_metrics = local_keys(store, run_id)
    local = store.events(run_id)
    local_attempts = _attempt_ids(local)
    events, metrics = _new_rows(record, known_events, known_metrics)
    foreign = [a for a in sorted(record.attempts.values(), key=lambda a: a.started_at)
               if a.id not in local_attempts and a.id != current]
    ends = [e["wall"] for e in local if (e["kind"], e["name"]) == ("lifecycle", "end")
            and not e["payload"].get("recovered")]
    events = _without_recovered_ends(events, record, ends)
    # recovered rows are rebuilt the same on every machine: one that already travelled in a
    # segment (a third machine imports the second's) is not added again
    travelled = known_events | record.keys()[0]
    events += [r for r in _recovered_rows(record, foreign, ends)
               if event_key(r) not in travelled]
    events.sort(key=lambda r: r[5])
    metrics.sort(key=lambda r: r[3])
    store.add_events([_event_dict(run_id, r) for r in events])
    store.add_metrics([{"run_id": run_id, "step": r[0], "name": r[1], "value": r[2], "wall": r[3]}
                       for r in metrics])
    restarts, total = _update_run(store, run, record, len(foreign))
    lost = [a for a in foreign if a.status is None]
    return ImportResult(len(events), len(metrics), foreign, lost, total, restarts)


def _recovered_rows(record: Record, foreign: list[Attempt], local_ends: list[float]
                    ) -> list[list[Any]]:
    """A price event for an attempt known only from its heartbeats; for an attempt that
    never ended cleanly, the event that says what was lost; for one that did, its end (the
    kernel records the end after the last segment is written: only the final heartbeat
    carries it), so that the bill does not count a clean end as a crash."""
    priced = {_payload(r).get("attempt") for s in record.segments for r in s.events
              if (r[1], r[2]) == ("cost", "price")}
    rows = [_price_row(a) for a in foreign if a.id not in priced]
    rows += [_lost_row(a, _last_wall(record, a.id)) for a in foreign if a.status is None]
    ends = local_ends + [r[5] for s in record.segments for r in s.events
                         if (r[1], r[2]) == ("lifecycle", "end") and not _payload(r).get(
                             "recovered")]
    starts = sorted(a.started_at for a in record.attempts.values())
    return rows + [_end_row(a) for a in foreign
                   if a.status is not None and not _ended_in(a, starts, ends)]


def _without_recovered_ends(events: list[list[Any]], record: Record, local_ends: list[float]
                            ) -> list[list[Any]]:
    """Another machine's recovered end of an attempt whose own end is known (this machine
    ran it, or its end travelled since) is not added beside it."""
    ends = local_ends + [r[5] for r in events if (r[1], r[2]) == ("lifecycle", "end")
                         and not _payload(r).get("recovered")]
    starts = sorted(a.started_at for a in record.attempts.values())
    kept = []
    for row in events:
        attempt = record.attempts.get(_payload(row).get("attempt", "")) if (
            row[1], row[2]) == ("lifecycle", "end") and _payload(row).get("recovered") else None
        if attempt is None or not _ended_in(attempt, starts, ends):
            kept.append(row)
    return kept


def _ended_in(attempt: Attempt, starts: list[float], ends: list[float]) -> bool:
    """An end event between the attempt's start and the next attempt's."""
    after = [s for s in starts if s > attempt.started_at]
    until = min(after) if after else float("inf")
    return any(attempt.started_at <= wall < until for wall in ends)


def _end_row(attempt: Attempt) -> list[Any]:
    """The end of an attempt that ended cleanly, from its final heartbeat."""
    payload = {"status": attempt.status, "stop_reason": attempt.stop_reason,
               "attempt": attempt.id, "host": attempt.host, "recovered": True}
    return [attempt.step, EventKind.LIFECYCLE.value, "end",
            f"{attempt.status} on {attempt.host} (attempt {attempt.id}; from its final heartbeat)",
            json.dumps(payload), attempt.last_seen]


def _update_run(store: Store, run: dict[str, Any], record: Record,
                num_foreign: int) -> tuple[int, float]:
    """Restarts count the other machines' attempts; the spend is the record's when larger."""
    restarts = int(run.get("restarts") or 0) + num_foreign
    total = max(float(run.get("cost_usd") or 0.0), record.total_usd)
    fields: dict[str, Any] = {"restarts": restarts, "cost_usd": total}
    started = record.started_at()
    if started is not None and started < float(run.get("started_at") or time.time()):
        fields["started_at"] = started
    store.update_run(record.run_id, **fields)
    return restarts, total


def _new_rows(record: Record, known_events: set[tuple[Any, ...]],
              known_metrics: set[tuple[Any, ...]]) -> tuple[list[list[Any]], list[list[Any]]]:
    seen_e, seen_m = set(known_events), set(known_metrics)
    events, metrics = [], []
    for segment in record.segments:
        for row in segment.events:
            key = event_key(row)
            if key not in seen_e:
                seen_e.add(key)
                events.append(row)
        for row in segment.metrics:
            key = metric_key(row)
            if key not in seen_m:
                seen_m.add(key)
                metrics.append(row)
    return events, metrics


def _attempt_ids(events: list[dict[str, Any]]) -> set[str]:
    return {e["payload"].get("attempt") for e in events
            if (e["kind"], e["name"]) == ("cost", "price") and e["payload"].get("attempt")}


def _payload(row: list[Any]) -> dict[str, Any]:
    try:
        found = json.loads(row[4] or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _last_wall(record: Record, attempt_id: str) -> float | None:
    walls = [max([r[5] for r in s.events] + [r[3] for r in s.metrics], default=0.0)
             for s in record.segments if s.attempt.id == attempt_id]
    return max(walls, default=None)


def _price_row(attempt: Attempt) -> list[Any]:
    """An attempt known only from its heartbeats: its start, as the meter would have written it."""
    payload = {"attempt": attempt.id, "host": attempt.host, "hourly_usd": attempt.hourly_usd,
               "recovered": True}
    return [0, EventKind.COST.value, "price", f"attempt {attempt.id} on {attempt.host} "
            f"(recovered from its heartbeat) at ${attempt.hourly_usd:.2f}/h",
            json.dumps(payload), attempt.started_at]


def _lost_row(attempt: Attempt, last_wall: float | None) -> list[Any]:
    """What could not be recovered of an attempt whose machine vanished."""
    since = (f"its events and metrics after {_clock(last_wall)} (its last record segment)"
             if last_wall else "all its events and metrics (it never wrote a record segment)")
    message = (f"attempt {attempt.id} on {attempt.host} was lost: last heard of at "
               f"{_clock(attempt.last_seen)} at step {attempt.step}; {since} could not be "
               f"recovered; billed ${attempt.attempt_usd:.2f} up to its last heartbeat")
    payload = {"attempt": attempt.id, "host": attempt.host, "last_seen": attempt.last_seen,
               "last_segment_wall": last_wall, "attempt_usd": attempt.attempt_usd,
               "attempt_s": max(0.0, attempt.last_seen - attempt.started_at)}
    return [attempt.step, EventKind.CHECKPOINT.value, "record_lost", message,
            json.dumps(payload), attempt.last_seen]


def _event_dict(run_id: str, row: list[Any]) -> dict[str, Any]:
    return {"run_id": run_id, "step": row[0], "kind": row[1], "name": row[2], "message": row[3],
            "payload": row[4], "wall": row[5]}


def _clock(wall: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall or 0))
