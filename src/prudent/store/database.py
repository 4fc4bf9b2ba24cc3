"""The run store: runs, metrics and events, in SQLite by default (any SQLAlchemy URL works).

Why SQLAlchemy Core: one process per machine is served by an embedded SQLite file in WAL
mode; several machines point ``store.url`` at PostgreSQL (``prudent[postgres]``), with no
change elsewhere. Training never waits on the database: rows go through :class:`StoreWriter`,
a background thread that commits in batches, so a crash loses at most ``flush_interval_s``
of metrics, and a database that goes away only makes it buffer until it is back.
Passwords in URLs are masked wherever prudent shows or records a URL (:func:`mask_url`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import operator
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)

from prudent.kernel.errors import ConfigError, StoreError, StoreLocked, StoreUnavailable

__all__ = ["LOCKED_WAIT_S", "SCHEMA_VERSION", "Store", "StoreSettings", "mask_url", "resolve_run",
           "run_folder"]

log = logging.getLogger("prudent.store")

SCHEMA_VERSION = 2
RUN_STATUSES = ("running", "completed", "stopped", "failed")
UNREACHABLE_WAIT_S = 30.0  # a restart or a failover of the database server, by default


class StoreSettings(BaseModel):
    """``store:`` in prudent.yaml."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field(".prudent", description="Folder for the database, checkpoints and reports "
                      "(PRUDENT_HOME overrides it).")
    url: str | None = Field(None, description="SQLAlchemy database URL; default: SQLite at "
                            "<home>/prudent.db. Use postgresql://user:password@host/db to share a "
                            "store across machines (pip install 'prudent[postgres]').")
    flush_interval_s: float = Field(0.5, gt=0, le=5, description="How often buffered metrics "
                                    "are committed: the most a crash can lose.")
    unreachable_wait_s: float = Field(UNREACHABLE_WAIT_S, ge=0, description="How long a process "
                                      "waits for a database server that went away (a restart, a failover) "
                                      "before it goes on without it, once per outage; SQLite "
                                      "never waits.")

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
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("stop_reason", sa.Text),
    sa.Column("config", sa.Text, nullable=False, default="{}"),
    sa.Column("host", sa.Text),
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
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("value", sa.Float),
    sa.Column("wall", sa.Float, nullable=False),
)
# Metric rows summed up per step bucket at a few widths, written in the same transaction as
# the rows themselves (by whoever writes metrics: the writer thread, a record import): a viewer
# of a million-point run reads thousands of these instead of a million rows. One row per
# bucket: a batch's sums are merged into it (an upsert), so a slow run writing one step per
# batch does not multiply its rows. SQLite and PostgreSQL; other databases keep none.
metric_rollup = sa.Table(
    "metric_rollup", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("width", sa.Integer, nullable=False),  # steps per bucket: ROLLUP_WIDTHS
    sa.Column("bucket", sa.Integer, nullable=False),  # step // width
    sa.Column("num", sa.Integer, nullable=False),  # rows
    sa.Column("num_values", sa.Integer, nullable=False),  # rows with a value (NaN is NULL)
    sa.Column("first_step", sa.Integer, nullable=False),
    sa.Column("last_step", sa.Integer, nullable=False),
    sa.Column("low", sa.Float),
    sa.Column("high", sa.Float),
    sa.Column("total", sa.Float),  # sum of the values: a mean (the profiler's timeline)
    sa.Column("wall", sa.Float),  # the newest row's wall time
    sa.Column("last", sa.Float),  # the newest row's value: the runs table's last metrics
    sa.Index("ux_metric_rollup_bucket", "run_id", "width", "name", "bucket", unique=True),
)
ROLLUP_WIDTHS = (16, 64, 256, 1024, 4096, 16384, 65536)
events = sa.Table(
    "events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), nullable=False, index=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("message", sa.Text, nullable=False, default=""),
    sa.Column("payload", sa.Text, nullable=False, default="{}"),
    sa.Column("wall", sa.Float, nullable=False),
)

# Free-text columns that version 1 declared VARCHAR(n): PostgreSQL enforces the length, so
# one long metric name would have failed a whole batch. SQLite never enforced it.
_WIDENED = {"runs": ("name", "stop_reason", "host"), "metrics": ("name",),
            "events": ("kind", "name")}


def _widen_text_columns(conn: sa.Connection) -> None:
    if conn.dialect.name != "postgresql":
        return
    for table, columns in _WIDENED.items():
        for column in columns:
            conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE TEXT")


# version -> function that brings a database at version-1 up to it. Version 1 creates all.
MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {
    1: lambda conn: metadata.create_all(conn),
    2: _widen_text_columns,
}
_MIGRATION_LOCK = 0x70727564  # PostgreSQL advisory lock: one process migrates at a time

T = TypeVar("T")

LOCKED_WAIT_S = 5.0  # what a run's start waits for another process's write lock, then goes on

# A write lock waited for at most this long on this thread (``Store.waiting_at_most``); None:
# the default wait (SQLite's busy timeout, retried: a store is rarely locked for long)
_LOCK_WAIT = threading.local()


def _lock_wait_s() -> float | None:
    return getattr(_LOCK_WAIT, "seconds", None)


def _retry(fn: Callable[[], T], attempts: int = 40, wait_s: float = 0.0) -> T:
    """SQLite says 'database is locked' under contention: wait and try again. A server that
    does not answer (restarting, a network cut) is tried again for ``wait_s``, and a pooled
    connection that died with its server twice, on a fresh one."""
    deadline = time.monotonic() + wait_s
    for attempt in range(1, 10**6):
        try:
            return fn()
        except DBAPIError as exc:
            reason = str(exc.orig)  # not str(exc): the statement's values could say "locked"
            locked = isinstance(exc, OperationalError) and ("locked" in reason or "busy" in reason)
            away = isinstance(exc, (OperationalError, InterfaceError)) or exc.connection_invalidated
            if locked and attempt < attempts and _lock_wait_s() is None:
                delay = min(0.5, 0.01 * 2 ** attempt)
            elif away and not locked and (attempt < 3 or time.monotonic() < deadline):
                delay = min(1.0, 0.05 * 2 ** attempt)
            else:
                raise
            time.sleep(delay * (0.5 + random.random()))
    raise AssertionError("unreachable")


_PASSWORD_IN_URL = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^:/@\s'\"]*:)[^/\s'\"]+@")


def mask_url(text: str) -> str:
    """Any ``scheme://user:password@`` in ``text`` with the password as ``***``."""
    return _PASSWORD_IN_URL.sub(r"\1***@", text)


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v) for v in value]
    return value


def database_url(url: str) -> str:
    """The SQLAlchemy URL to connect with: ``postgresql://`` and ``postgres://`` use psycopg 3
    unless psycopg2 is installed (SQLAlchemy's default), and a missing driver names the extra."""
    try:
        parsed = sa.engine.make_url(url)
    except ArgumentError:
        raise ConfigError(f"store.url {mask_url(url)!r} is not a database URL: use e.g. "
                          "postgresql://user:password@host:5432/prudent") from None
    if parsed.drivername in ("postgresql", "postgres"):
        driver = "psycopg2" if importlib.util.find_spec("psycopg2") else "psycopg"
        parsed = parsed.set(drivername=f"postgresql+{driver}")
    if parsed.drivername == "postgresql+psycopg" and importlib.util.find_spec("psycopg") is None:
        raise ConfigError(f"store.url {mask_url(url)!r} needs the PostgreSQL driver: "
                          "pip install 'prudent[postgres]'")
    return parsed.render_as_string(hide_password=False)


def describe_error(exc: BaseException) -> str:
    """The driver's own first line, without SQLAlchemy's statement and help link."""
    if isinstance(exc, StoreUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return mask_url(text[0] if text else type(exc).__name__)


class _SlowCalls:
    """Says once when a store call has waited ``SLOW_S`` (a lock another process holds, a
    server that does not answer), so that a wait is never silent; again for the next wait.
    Its thread lives only while a call is in progress."""

    SLOW_S = 5.0

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._calls: dict[object, tuple[float, str]] = {}
        self._said: set[str] = set()
        self._watching = False

    @contextlib.contextmanager
    def timing(self, url: str) -> Iterator[None]:
        if _lock_wait_s() is not None:  # a bounded wait: its caller says what it gave up on
            yield
            return
        key = object()
        with self._changed:
            self._calls[key] = (time.monotonic(), url)
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, daemon=True, name="prudent-store-wait").start()
        try:
            yield
        finally:
            with self._changed:
                del self._calls[key]
                if not any(u == url for _, u in self._calls.values()):
                    self._said.discard(url)
                self._changed.notify()

    def _watch(self) -> None:
        while True:
            with self._changed:
                if not self._calls:
                    self._watching = False
                    return
                self._changed.wait(0.5)
                now = time.monotonic()
                slow = {url for started, url in self._calls.values()
                        if now - started >= self.SLOW_S} - self._said
                self._said |= slow
            for url in sorted(slow):
                print(f"prudent: waiting for the run store {url} for {self.SLOW_S:.0f} s now: "
                      "another process holds its lock (a sqlite3 shell, a backup, a long "
                      "write) or its server does not answer; prudent waits for it (a run "
                      "under way keeps training meanwhile)",
                      file=sys.stderr, flush=True)


_SLOW = _SlowCalls()


class Store:
    """Typed access to the run store. Thread-safe; short transactions only."""

    _away_since: float | None = None  # when a call first found the server away (monotonic)

    def __init__(self, url: str, unreachable_wait_s: float = UNREACHABLE_WAIT_S) -> None:
        self.url = mask_url(url)  # for messages; the password stays in the engine only
        self.engine = self._create_engine(database_url(url))
        self._writer_engine = self.engine.execution_options(prudent_write=True)
        # How long a call waits for a server that went away before it raises: long enough
        # for a restart or a failover, so the end of a run is still recorded. Counted from
        # the first call that found it away: once it has had that long, every call fails at
        # once until one gets through (a server gone for good costs a run's end one wait,
        # not one per call). store.unreachable_wait_s sets it (Store.open).
        self.unreachable_wait_s = 0.0 if self.engine.dialect.name == "sqlite" else unreachable_wait_s
        try:
            with _SLOW.timing(self.url):
                if not _retry(self._schema_current):  # a current store opens without a lock
                    _retry(self._migrate)
        except (DBAPIError, OSError) as exc:
            self.engine.dispose()
            raise StoreError(self._unreachable(exc)) from None
        except BaseException:
            self.engine.dispose()
            raise

    def _unreachable(self, exc: BaseException) -> str:
        reason = describe_error(exc)
        if self.engine.dialect.name == "sqlite" and any(
                sign in reason for sign in ("not a database", "malformed", "corrupt")):
            path = self.engine.url.database
            return (f"the run store {self.url} is corrupt ({reason}): repair it with `prudent "
                    "store repair` (every readable row kept, the runs' records beside their "
                    f"checkpoints added back, {path} kept beside it), or move it aside (mv "
                    f"{path} {path}.corrupt) and run again; each run's record beside its "
                    "checkpoints is imported into the new store when that run starts again")
        fix = ("check that the server is up and reachable from this machine, or point "
               "store.url / PRUDENT_STORE_URL elsewhere" if self.engine.dialect.name != "sqlite"
               else "check that the folder exists and is writable (store.home / PRUDENT_HOME)")
        return f"cannot open the run store {self.url}: {reason}; {fix}"

    @classmethod
    def open(cls, settings: StoreSettings) -> Store:
        if settings.url is None:
            os.makedirs(settings.home, exist_ok=True)
            path = Path(settings.home) / "prudent.db"
            if path.is_file() and path.stat().st_size == 0:  # SQLite would take it as new
                print(f"prudent: warning: the run store {path} is empty (0 bytes): the runs it "
                      "held are gone from it; each run's record beside its checkpoints is "
                      "imported again when that run starts again", file=sys.stderr, flush=True)
        return cls(settings.database_url(), settings.unreachable_wait_s)

    @staticmethod
    def _create_engine(url: str) -> sa.Engine:
        if not url.startswith("sqlite"):
            # A server that does not answer fails fast instead of hanging the first open.
            timeout = {} if "connect_timeout" in url or not url.startswith("postgresql") \
                else {"connect_timeout": 10}
            return sa.create_engine(url, pool_pre_ping=True, connect_args=timeout)
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
            bounded = _lock_wait_s()
            busy_ms = 30000 if bounded is None else int(1000 * bounded)
            if conn.info.get("busy_ms", 30000) != busy_ms:  # as set at connect, or last time
                conn.exec_driver_sql(f"PRAGMA busy_timeout={busy_ms}")
                conn.info["busy_ms"] = busy_ms
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    def _migrate(self) -> None:
        with self._writer_engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # DDL from two machines at once would clash
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": _MIGRATION_LOCK})
            current = self._version(conn)
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"the run store {self.url} has schema version {current}, newer than this "
                    f"prudent understands ({SCHEMA_VERSION}): upgrade prudent"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[version](conn)
                conn.execute(schema_info.delete())
                conn.execute(schema_info.insert().values(id=1, version=version))
            _ensure_rollup(conn)

    def _schema_current(self) -> bool:
        """Whether the schema needs nothing written (a read: another process's write lock
        does not block it)."""
        with self.engine.connect() as conn:
            if self._version(conn) != SCHEMA_VERSION:
                return False
            return _rollup_current(sa.inspect(conn))

    @contextlib.contextmanager
    def waiting_at_most(self, seconds: float | None) -> Iterator[None]:
        """This thread's writes inside the block wait at most ``seconds`` for a write lock
        another process holds, then raise :class:`StoreUnavailable` (the training thread
        must not wait for a ``sqlite3`` shell or a backup). A server that does not answer
        still gets its usual wait."""
        before = _lock_wait_s()
        _LOCK_WAIT.seconds = before if seconds is None else seconds
        try:
            yield
        finally:
            _LOCK_WAIT.seconds = before

    @staticmethod
    def _version(conn: sa.Connection) -> int:
        if not sa.inspect(conn).has_table("schema_info"):
            return 0
        row = conn.execute(sa.select(schema_info.c.version)).first()
        return int(row[0]) if row else 0

    def schema_version(self) -> int:
        return self._read(self._version)

    def close(self) -> None:
        self.engine.dispose()

    # runs ---------------------------------------------------------------------------------
    def create_run(self, run_id: str, name: str, **fields: Any) -> None:
        """A new run; if another machine created ``run_id`` first, this is its next attempt."""
        values = {"id": run_id, "name": name, "status": "running", "started_at": time.time(),
                  "restarts": 0, "cost_usd": 0.0, **fields}
        values["config"] = json.dumps(_masked(values.get("config") or {}), default=str)
        try:
            self._retry(lambda: self._execute(runs.insert().values(**values)))
        except IntegrityError:
            if self.get_run(run_id) is None:
                raise
            self.count_restart(run_id)
            if fields:
                self.update_run(run_id, **fields)

    def update_run(self, run_id: str, **fields: Any) -> None:
        if "config" in fields:
            fields["config"] = json.dumps(_masked(fields["config"]), default=str)
        stmt = runs.update().where(runs.c.id == run_id).values(**fields)
        self._retry(lambda: self._execute(stmt))

    def close_if_running(self, run_id: str, **fields: Any) -> bool:
        """``update_run`` only while the run is still ``running`` (one statement: a run its
        own process closed meanwhile, rank 0 on another machine, keeps its own end)."""
        stmt = runs.update().where(runs.c.id == run_id, runs.c.status == "running").values(
            **fields)
        return bool(self._retry(lambda: self._execute_count(stmt)))

    def count_restart(self, run_id: str) -> None:
        stmt = runs.update().where(runs.c.id == run_id).values(
            restarts=runs.c.restarts + 1, status="running", stop_reason=None, ended_at=None,
            exit_code=None)
        self._retry(lambda: self._execute(stmt))

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        stmt = sa.select(runs).where(runs.c.id == run_id)
        row = self._read(lambda conn: conn.execute(stmt).mappings().first())
        return self._with_steps([_run_dict(row)])[0] if row else None

    def list_runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        stmt = sa.select(runs).order_by(runs.c.started_at.desc()).limit(limit)
        rows = self._read(lambda c: c.execute(stmt).mappings().all())
        return self._with_steps([_run_dict(row) for row in rows])

    def _with_steps(self, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``step`` as far as the run's metrics went: a run writes its step count when it
        ends, so a running run (or one killed before it could) would read its start's."""
        ids = [run["id"] for run in found if run["status"] == "running" or run["ended_at"] is None
               or not run["step"]]
        if not ids:
            return found
        reached: dict[str, int] = {}
        for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
            rollup = (sa.select(metric_rollup.c.run_id, sa.func.max(metric_rollup.c.last_step))
                      .where(metric_rollup.c.width == ROLLUP_WIDTHS[-1],
                             metric_rollup.c.run_id.in_(chunk))
                      .group_by(metric_rollup.c.run_id))  # a few rows per run
            raw = (sa.select(metrics.c.run_id, sa.func.max(metrics.c.step))
                   .where(metrics.c.run_id.in_(chunk)).group_by(metrics.c.run_id))
            try:
                rows = self._read(lambda c, q=rollup: c.execute(q).all())
            except (sa.exc.DBAPIError, StoreUnavailable):  # a store without the rollup (other databases, a copy
                rows = []  # made by a prudent that predates it)
            if len(rows) < len(chunk):
                rows = self._read(lambda c, q=raw: c.execute(q).all())
            reached.update({run_id: int(step or 0) for run_id, step in rows})
        for run in found:
            run["step"] = max(run["step"] or 0, reached.get(run["id"], 0))
        return found

    def find_run_ids(self, prefix: str) -> list[str]:
        stmt = sa.select(runs.c.id).where(runs.c.id.startswith(prefix, autoescape=True))
        return [row[0] for row in self._read(lambda conn: conn.execute(stmt).all())]

    # metrics and events -------------------------------------------------------------------
    def add_metrics(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            self._retry(lambda: self._write_records(rows, ()))

    def add_events(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            self._retry(lambda: self._execute(events.insert(), [_masked_event(r) for r in rows]))

    def add_records(self, metric_rows: Sequence[dict[str, Any]],
                    event_rows: Sequence[dict[str, Any]]) -> None:
        """Metrics and events in one transaction: a failed batch can be retried whole."""
        if metric_rows or event_rows:
            self._timed(lambda: _retry(lambda: self._write_records(metric_rows, event_rows)))

    def _write_records(self, metric_rows: Sequence[dict[str, Any]],
                       event_rows: Sequence[dict[str, Any]]) -> None:
        with self._writer_engine.begin() as conn:
            if metric_rows:
                metric_rows = [_nan_as_null(r) for r in metric_rows]
                sql, order = _metrics_insert(conn.dialect)
                # the driver's own executemany: SQLAlchemy's per-row parameter processing
                # doubled the writer thread's CPU per metric row (10.8 -> 5.4 us on SQLite),
                # time the training thread may wait for the GIL
                conn.exec_driver_sql(sql, list(map(order, metric_rows)) if order is not None
                                     else [{c: r[c] for c in _METRIC_COLUMNS} for r in metric_rows])
                upsert = _rollup_upsert(conn.dialect.name)
                if upsert is not None:
                    conn.execute(upsert, rollup_rows(metric_rows))
            if event_rows:
                conn.execute(events.insert(), [_masked_event(r) for r in event_rows])

    def rebuild_rollup(self, batch: int = 100_000) -> None:
        """Sum the rollup again from every metric row, in the order they were written (rows
        copied into a repaired store without their rollup)."""
        columns = [metrics.c.id, *(metrics.c[name] for name in _METRIC_COLUMNS)]
        with self._writer_engine.begin() as conn:
            conn.execute(metric_rollup.delete())
            upsert = _rollup_upsert(conn.dialect.name)
            last = 0
            while upsert is not None:
                rows = conn.execute(sa.select(*columns).where(metrics.c.id > last)
                                    .order_by(metrics.c.id).limit(batch)).mappings().all()
                if not rows:
                    return
                conn.execute(upsert, rollup_rows(rows))
                last = rows[-1]["id"]

    def last_metrics(self, run_id: str) -> dict[str, float | None]:
        newest = (sa.select(metrics.c.name, sa.func.max(metrics.c.id).label("id"))
                  .where(metrics.c.run_id == run_id).group_by(metrics.c.name).subquery())
        stmt = (sa.select(metrics.c.name, metrics.c.value)
                .join(newest, metrics.c.id == newest.c.id).order_by(metrics.c.name))
        return dict(self._read(lambda conn: conn.execute(stmt).all()))

    def metric_series(self, run_id: str, name: str) -> list[tuple[int, float | None]]:
        stmt = (sa.select(metrics.c.step, metrics.c.value)
                .where(metrics.c.run_id == run_id, metrics.c.name == name).order_by(metrics.c.id))
        return [(step, value) for step, value in self._read(lambda c: c.execute(stmt).all())]

    def count_metrics(self, run_id: str | None = None, name: str | None = None) -> int:
        stmt = sa.select(sa.func.count()).select_from(metrics)
        if run_id is not None:
            stmt = stmt.where(metrics.c.run_id == run_id)
        if name is not None:
            stmt = stmt.where(metrics.c.name == name)
        return int(self._read(lambda conn: conn.execute(stmt).scalar_one()))

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """In time order: rows another machine's record brought in come where they happened."""
        stmt = (sa.select(events).where(events.c.run_id == run_id)
                .order_by(events.c.wall, events.c.id))
        rows = self._read(lambda conn: conn.execute(stmt).mappings().all())
        return [{"step": r["step"], "kind": r["kind"], "name": r["name"], "message": r["message"],
                 "payload": json.loads(r["payload"] or "{}"), "wall": r["wall"]} for r in rows]

    def _retry(self, fn: Callable[[], T]) -> T:
        try:
            return self._timed(lambda: _retry(fn, wait_s=self._wait_left_s()))
        except (OperationalError, InterfaceError) as exc:  # the rest: refused for what it held
            reason = describe_error(exc)
            unavailable = StoreLocked if _lock_wait_s() is not None and "locked" in str(
                getattr(exc, "orig", exc)) else StoreUnavailable
            raise unavailable(f"cannot use the run store {self.url}: {reason}") from exc

    def _timed(self, call: Callable[[], T]) -> T:
        """``call``, noting when the server was first found away and when it answers again."""
        began = time.monotonic()
        try:
            with _SLOW.timing(self.url):
                found = call()
        except (OperationalError, InterfaceError):
            if self._away_since is None:
                self._away_since = began
            raise
        self._away_since = None
        return found

    def _wait_left_s(self) -> float:
        left = self.wait_left_s()
        return self.unreachable_wait_s if left is None else left

    def wait_left_s(self) -> float | None:
        """While the server is known to be away, how much longer a call waits for it (0: a
        call fails at once); None while it answers, and for SQLite (no server to wait for)."""
        if self._away_since is None or not self.unreachable_wait_s:
            return None
        return max(0.0, self.unreachable_wait_s - (time.monotonic() - self._away_since))

    def _read(self, fn: Callable[[sa.Connection], T]) -> T:
        def read() -> T:
            with self.engine.connect() as conn:
                return fn(conn)

        return self._retry(read)

    def _execute(self, stmt: sa.Executable, params: Any = None) -> None:
        with self._writer_engine.begin() as conn:
            conn.execute(stmt, params) if params is not None else conn.execute(stmt)

    def _execute_count(self, stmt: sa.Executable) -> int:
        """Rows the statement changed."""
        with self._writer_engine.begin() as conn:
            return int(conn.execute(stmt).rowcount)

    def delete_run(self, run_id: str) -> None:
        """Forget a run that never ran (refused before its first step): row, metrics, events."""
        def delete() -> None:
            with self._writer_engine.begin() as conn:
                for table in (metrics, metric_rollup, events):
                    conn.execute(table.delete().where(table.c.run_id == run_id))
                conn.execute(runs.delete().where(runs.c.id == run_id))

        _retry(delete)


def _ensure_rollup(conn: sa.Connection) -> None:
    """The rollup table, added beside schema version 2 rather than as version 3: a prudent that
    predates it still opens the store (its rows have no rollup; viewers read them raw). It holds
    only what can be summed again from ``metrics``: one of another shape is dropped and made
    anew, and the runs it covered are read raw."""
    inspector = sa.inspect(conn)
    if _rollup_current(inspector):
        return
    if inspector.has_table("metric_rollup"):
        metric_rollup.drop(conn)
    metric_rollup.create(conn)


def _rollup_current(inspector: Any) -> bool:
    """The rollup table is there, of today's shape."""
    return inspector.has_table("metric_rollup") and {
        c["name"] for c in inspector.get_columns("metric_rollup")} == set(metric_rollup.c.keys())


_METRIC_COLUMNS = ("run_id", "step", "name", "value", "wall")


@functools.cache
def _metrics_insert(dialect: sa.Dialect) -> tuple[str, Callable[[dict[str, Any]], tuple[Any, ...]] | None]:
    """The INSERT of a metric row in the driver's own parameter style, and for a positional
    style what turns a row into its parameters (``None``: named, rows go as dicts)."""
    compiled = metrics.insert().compile(dialect=dialect, column_keys=list(_METRIC_COLUMNS),
                                       for_executemany=True)
    if not dialect.positional or not compiled.positiontup:
        return str(compiled), None
    return str(compiled), operator.itemgetter(*compiled.positiontup)


@functools.cache
def _rollup_upsert(dialect: str) -> sa.Executable | None:
    """INSERT ... ON CONFLICT DO UPDATE merging a batch's sums into its buckets' rows."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
        lesser, greater = sa.func.least, sa.func.greatest  # both skip NULLs
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert

        def lesser(a: Any, b: Any) -> Any:  # SQLite's min(a, NULL) is NULL
            return sa.func.min(sa.func.coalesce(a, b), sa.func.coalesce(b, a))

        def greater(a: Any, b: Any) -> Any:
            return sa.func.max(sa.func.coalesce(a, b), sa.func.coalesce(b, a))
    else:
        return None
    stmt = insert(metric_rollup)
    old, new = metric_rollup.c, stmt.excluded
    return stmt.on_conflict_do_update(
        index_elements=[old.run_id, old.width, old.name, old.bucket],
        set_={"num": old.num + new.num, "num_values": old.num_values + new.num_values,
              "first_step": lesser(old.first_step, new.first_step),
              "last_step": greater(old.last_step, new.last_step),
              "low": lesser(old.low, new.low), "high": greater(old.high, new.high),
              "total": sa.func.coalesce(old.total + new.total, old.total, new.total),
              "wall": greater(old.wall, new.wall), "last": new.last})


def _nan_as_null(row: dict[str, Any]) -> dict[str, Any]:
    """A metric row whose NaN is NULL, on every database and in the rollup (a gap in the
    curve): SQLite does it itself, PostgreSQL would keep the NaN, and its max() ranks NaN above
    every number (a run's last value read nan where SQLite has none)."""
    value = row["value"]
    return {**row, "value": None} if value is not None and value != value else row


def rollup_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``metric_rollup`` rows summing up metric rows (NaN already NULL: ``_nan_as_null``) at
    every width of ``ROLLUP_WIDTHS``. One dict update per metric row (the narrowest width); the
    wider ones merge those."""
    narrow: dict[tuple[str, str, int], list[Any]] = {}
    width = ROLLUP_WIDTHS[0]
    for order, row in enumerate(rows):
        value, step, wall = row["value"], row["step"], row["wall"]
        key = (row["run_id"], row["name"], step // width)
        found = narrow.get(key)
        if found is None:
            narrow[key] = [1, int(value is not None), step, step, value, value, value, wall,
                           value, order]
            continue
        found[0] += 1  # _merge, inlined: this loop runs once per metric row
        found[2], found[3] = min(found[2], step), max(found[3], step)
        found[7], found[8], found[9] = max(found[7], wall), value, order
        if value is not None:
            found[1] += 1
            if found[4] is None:
                found[4] = found[5] = found[6] = value
            else:
                found[4], found[5] = min(found[4], value), max(found[5], value)
                found[6] += value
    levels = {width: narrow}
    for wider in ROLLUP_WIDTHS[1:]:
        merged: dict[tuple[str, str, int], list[Any]] = {}
        for (run_id, name, bucket), sums in levels[width].items():
            key = (run_id, name, bucket * width // wider)
            if key in merged:
                _merge(merged[key], sums)
            else:
                merged[key] = list(sums)
        levels[wider], width = merged, wider
    columns = ("num", "num_values", "first_step", "last_step", "low", "high", "total", "wall",
               "last")  # not the order of the last row: a batch's own
    return [{"run_id": run_id, "name": name, "width": w, "bucket": bucket,
             **dict(zip(columns, sums))}
            for w, level in levels.items() for (run_id, name, bucket), sums in level.items()]


def _merge(into: list[Any], other: Sequence[Any]) -> None:
    into[0] += other[0]
    into[1] += other[1]
    into[2] = min(into[2], other[2])
    into[3] = max(into[3], other[3])
    into[7] = max(into[7], other[7])
    if other[9] > into[9]:  # the newer last row, in the batch's order
        into[8], into[9] = other[8], other[9]
    if other[4] is not None:
        if into[4] is None:
            into[4:7] = other[4:7]
        else:
            into[4], into[5] = min(into[4], other[4]), max(into[5], other[5])
            into[6] += other[6]


def run_folder(home: str | Path, run_id: str) -> Path:
    """A run's own folder under the store's home (``$PRUDENT_HOME/runs/<id>``): its
    checkpoints and record, captures, traces, profile and report."""
    return Path(home).resolve() / "runs" / run_id


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


def _masked_event(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "message": mask_url(row.get("message", "")),
            "payload": mask_url(row.get("payload", "{}"))}


def _run_dict(row: Any) -> dict[str, Any]:
    run = dict(row)
    run["config"] = json.loads(run["config"] or "{}")
    return run
