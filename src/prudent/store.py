"""The run store: runs, metrics and events, in SQLite by default (any SQLAlchemy URL works).

Why SQLAlchemy Core: one process per machine is served by an embedded SQLite file in WAL
mode; several machines point ``store.url`` at PostgreSQL, with no change elsewhere.
Training never waits on the database: rows go through :class:`StoreWriter`, a background
thread that commits in batches, so a crash loses at most ``flush_interval_s`` of metrics.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import DBAPIError, OperationalError

from prudent.errors import ConfigError, StoreError

__all__ = ["SCHEMA_VERSION", "NullWriter", "Store", "StoreSettings", "StoreWriter",
           "resolve_run"]

log = logging.getLogger("prudent.store")

SCHEMA_VERSION = 1
RUN_STATUSES = ("running", "completed", "stopped", "failed")


class StoreSettings(BaseModel):
    """``store:`` in prudent.yaml."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field(".prudent", description="Folder for the database, checkpoints and reports "
                      "(PRUDENT_HOME overrides it).")
    url: str | None = Field(None, description="SQLAlchemy database URL; default: SQLite at "
                            "<home>/prudent.db. Use postgresql://... to share across machines.")
    flush_interval_s: float = Field(0.5, gt=0, le=5, description="How often buffered metrics "
                                    "are committed: the most a crash can lose.")

    def database_url(self) -> str:
        return self.url or f"sqlite:///{Path(self.home).resolve() / 'prudent.db'}"


metadata = sa.MetaData()

schema_info = sa.Table(
    "schema_info", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
)
runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("stop_reason", sa.String(128)),
    sa.Column("config", sa.Text, nullable=False, default="{}"),
    sa.Column("host", sa.String(256)),
    sa.Column("pid", sa.Integer),
    sa.Column("command", sa.Text),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float),
    sa.Column("restarts", sa.Integer, nullable=False, default=0),
    sa.Column("cost_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("exit_code", sa.Integer),
    sa.Column("step", sa.Integer, nullable=False, default=0),
    sa.Column("epoch", sa.Integer, nullable=False, default=0),
)
metrics = sa.Table(
    "metrics", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), nullable=False, index=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("value", sa.Float),
    sa.Column("wall", sa.Float, nullable=False),
)
events = sa.Table(
    "events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), nullable=False, index=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("message", sa.Text, nullable=False, default=""),
    sa.Column("payload", sa.Text, nullable=False, default="{}"),
    sa.Column("wall", sa.Float, nullable=False),
)

# version -> function that brings a database at version-1 up to it. Version 1 creates all.
MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {
    1: lambda conn: metadata.create_all(conn),
}

T = TypeVar("T")


def _retry(fn: Callable[[], T], attempts: int = 40) -> T:
    """SQLite says 'database is locked' under contention; wait and try again."""
    for attempt in range(attempts):
        try:
            return fn()
        except OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(min(0.5, 0.01 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


class Store:
    """Typed access to the run store. Thread-safe; short transactions only."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = self._create_engine(url)
        self._writer_engine = self.engine.execution_options(prudent_write=True)
        try:
            _retry(self._migrate)
        except (DBAPIError, OSError) as exc:
            raise StoreError(f"cannot open the run store {url!r}: {exc}") from None

    @classmethod
    def open(cls, settings: StoreSettings) -> Store:
        if settings.url is None:
            os.makedirs(settings.home, exist_ok=True)
        return cls(settings.database_url())

    @staticmethod
    def _create_engine(url: str) -> sa.Engine:
        if not url.startswith("sqlite"):
            return sa.create_engine(url, pool_pre_ping=True)
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, see below
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            # Writers take the lock up front: a deferred transaction that upgrades from read to
            # write can fail with SQLITE_BUSY without ever calling the busy handler.
            write = conn.get_execution_options().get("prudent_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    def _migrate(self) -> None:
        with self._writer_engine.begin() as conn:
            current = self._version(conn)
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"the run store {self.url!r} has schema version {current}, newer than this "
                    f"prudent understands ({SCHEMA_VERSION}): upgrade prudent"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[version](conn)
                conn.execute(schema_info.delete())
                conn.execute(schema_info.insert().values(id=1, version=version))

    @staticmethod
    def _version(conn: sa.Connection) -> int:
        if not sa.inspect(conn).has_table("schema_info"):
            return 0
        row = conn.execute(sa.select(schema_info.c.version)).first()
        return int(row[0]) if row else 0

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return self._version(conn)

    def close(self) -> None:
        self.engine.dispose()

    # runs ---------------------------------------------------------------------------------
    def create_run(self, run_id: str, name: str, **fields: Any) -> None:
        values = {"id": run_id, "name": name, "status": "running", "started_at": time.time(),
                  "restarts": 0, "cost_usd": 0.0, **fields}
        values["config"] = json.dumps(values.get("config") or {}, default=str)
        _retry(lambda: self._execute(runs.insert().values(**values)))

    def update_run(self, run_id: str, **fields: Any) -> None:
        if "config" in fields:
            fields["config"] = json.dumps(fields["config"], default=str)
        stmt = runs.update().where(runs.c.id == run_id).values(**fields)
        _retry(lambda: self._execute(stmt))

    def count_restart(self, run_id: str) -> None:
        stmt = runs.update().where(runs.c.id == run_id).values(
            restarts=runs.c.restarts + 1, status="running", stop_reason=None, ended_at=None,
            exit_code=None)
        _retry(lambda: self._execute(stmt))

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).mappings().first()
        return _run_dict(row) if row else None

    def list_runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        stmt = sa.select(runs).order_by(runs.c.started_at.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [_run_dict(row) for row in conn.execute(stmt).mappings()]

    def find_run_ids(self, prefix: str) -> list[str]:
        stmt = sa.select(runs.c.id).where(runs.c.id.startswith(prefix, autoescape=True))
        with self.engine.connect() as conn:
            return [row[0] for row in conn.execute(stmt)]

    # metrics and events -------------------------------------------------------------------
    def add_metrics(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            _retry(lambda: self._execute(metrics.insert(), list(rows)))

    def add_events(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            _retry(lambda: self._execute(events.insert(), list(rows)))

    def last_metrics(self, run_id: str) -> dict[str, float | None]:
        newest = (sa.select(metrics.c.name, sa.func.max(metrics.c.id).label("id"))
                  .where(metrics.c.run_id == run_id).group_by(metrics.c.name).subquery())
        stmt = (sa.select(metrics.c.name, metrics.c.value)
                .join(newest, metrics.c.id == newest.c.id).order_by(metrics.c.name))
        with self.engine.connect() as conn:
            return dict(conn.execute(stmt).all())

    def metric_series(self, run_id: str, name: str) -> list[tuple[int, float | None]]:
        stmt = (sa.select(metrics.c.step, metrics.c.value)
                .where(metrics.c.run_id == run_id, metrics.c.name == name).order_by(metrics.c.id))
        with self.engine.connect() as conn:
            return [(step, value) for step, value in conn.execute(stmt)]

    def count_metrics(self, run_id: str | None = None) -> int:
        stmt = sa.select(sa.func.count()).select_from(metrics)
        if run_id is not None:
            stmt = stmt.where(metrics.c.run_id == run_id)
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def events(self, run_id: str) -> list[dict[str, Any]]:
        stmt = sa.select(events).where(events.c.run_id == run_id).order_by(events.c.id)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).mappings().all()
        return [{"step": r["step"], "kind": r["kind"], "name": r["name"], "message": r["message"],
                 "payload": json.loads(r["payload"] or "{}"), "wall": r["wall"]} for r in rows]

    def _execute(self, stmt: sa.Executable, params: Any = None) -> None:
        with self._writer_engine.begin() as conn:
            conn.execute(stmt, params) if params is not None else conn.execute(stmt)


def resolve_run(store: Store, ref: str) -> str:
    """An exact id, ``latest``, or a unique id prefix -> the run id."""
    if ref in ("latest", "last"):
        newest = store.list_runs(1)
        if not newest:
            raise ConfigError("there are no runs yet: start one with prudent run -- python train.py")
        return str(newest[0]["id"])
    if store.get_run(ref) is not None:
        return ref
    matches = store.find_run_ids(ref)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ConfigError(f"no run {ref!r} in {store.url}: see `prudent runs` for the ids")
    raise ConfigError(f"run {ref!r} is ambiguous ({', '.join(sorted(matches)[:5])}): "
                      "give more of the id")


def _run_dict(row: Any) -> dict[str, Any]:
    run = dict(row)
    run["config"] = json.loads(run["config"] or "{}")
    return run


class StoreWriter:
    """Writes metrics and events from a background thread, in batches.

    ``put_metrics`` takes values that may still be tensors (on any device): they are turned
    into floats here, off the training thread, one stacked transfer per device per batch.
    Errors never reach the training loop; they are counted and logged once.
    """

    def __init__(self, store: Store, flush_interval_s: float = 0.5) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self.latest: dict[str, float] = {}
        self.num_errors = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._loop, name="prudent-store-writer", daemon=True)
        self._thread.start()

    def put_metrics(self, run_id: str, steps: list[tuple[int, float, dict[str, Any]]]) -> None:
        """``steps``: ``(step, wall time, {name: number or tensor})`` tuples."""
        self._idle.clear()
        self._queue.put(("metrics", run_id, steps))

    def put_event(self, row: dict[str, Any]) -> None:
        self._idle.clear()
        self._queue.put(("event", row))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until everything queued so far is committed."""
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self._queue.put(("stop",))
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        pending_metrics: list[dict[str, Any]] = []
        pending_events: list[dict[str, Any]] = []
        deadline = time.monotonic() + self.flush_interval_s
        stop = False
        while not stop:
            waiters: list[threading.Event] = []
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                stop = self._take(item, pending_metrics, pending_events, waiters)
                while True:  # drain whatever else is already queued
                    item = self._queue.get_nowait()
                    stop = self._take(item, pending_metrics, pending_events, waiters) or stop
            except queue.Empty:
                pass
            if waiters or stop or time.monotonic() >= deadline:
                self._commit(pending_metrics, pending_events)
                pending_metrics, pending_events = [], []
                deadline = time.monotonic() + self.flush_interval_s
            for waiter in waiters:
                waiter.set()

    def _take(self, item: tuple[Any, ...], out_metrics: list[dict[str, Any]],
              out_events: list[dict[str, Any]], waiters: list[threading.Event]) -> bool:
        kind = item[0]
        if kind == "metrics":
            out_metrics.extend(self._metric_rows(item[1], item[2]))
        elif kind == "event":
            out_events.append(item[1])
        elif kind == "flush":
            waiters.append(item[1])
        return kind == "stop"

    def _metric_rows(self, run_id: str, steps: list[tuple[int, float, dict[str, Any]]]
                     ) -> list[dict[str, Any]]:
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
                self.latest[name] = values[index]
                index += 1
        return rows

    def _commit(self, metric_rows: list[dict[str, Any]], event_rows: list[dict[str, Any]]) -> None:
        try:
            self.store.add_metrics(metric_rows)
            self.store.add_events(event_rows)
        except Exception as exc:
            self._report(exc)

    def _report(self, exc: BaseException) -> None:
        self.num_errors += 1
        if self.num_errors == 1:
            log.warning("prudent could not write to the run store (%s); training goes on", exc)


class NullWriter:
    """A StoreWriter that keeps nothing: for torchrun ranks other than 0."""

    num_errors = 0

    def __init__(self) -> None:
        self.latest: dict[str, float] = {}

    def put_metrics(self, run_id: str, steps: list[tuple[int, float, dict[str, Any]]]) -> None:
        pass

    def put_event(self, row: dict[str, Any]) -> None:
        pass

    def flush(self, timeout_s: float = 30.0) -> None:
        pass

    def close(self, timeout_s: float = 30.0) -> None:
        pass


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
