"""Read-only access to the run store, for the report and the dashboard.

A training run writes the same SQLite file while a person looks at it, so the viewer must never
take a lock a writer waits on: SQLite is opened with ``mode=ro`` and ``query_only`` (no
statement can write, by construction), each read is one short statement (WAL readers never
block the writer), and a busy database is waited on, never reported as "database is locked".
PostgreSQL sessions are opened read-only (``default_transaction_read_only``). The schema is
checked, never migrated.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from prudent.kernel.errors import ConfigError, StoreError, StoreUnavailable
from prudent.store.database import SCHEMA_VERSION, Store, database_url, describe_error, mask_url

__all__ = ["ReadOnlyStore", "open_readonly"]


class ReadOnlyStore(Store):
    """The store's typed reads (``get_run``, ``list_runs``, ``events``, ...) over a read-only
    connection. Its writing methods fail: the database refuses them."""

    def __init__(self, url: str) -> None:  # no super().__init__: that would migrate (write)
        self.url = mask_url(url)
        self.engine = _readonly_engine(database_url(url))
        self.unreachable_wait_s = 0.0
        try:
            version = self.schema_version()
        except (sa.exc.DBAPIError, StoreUnavailable) as exc:
            self.engine.dispose()
            raise StoreError(f"cannot read the run store {self.url}: "
                             f"{describe_error(exc)}") from None
        if version > SCHEMA_VERSION:
            self.engine.dispose()
            raise StoreError(f"the run store {self.url} has schema version {version}, newer "
                             f"than this prudent understands ({SCHEMA_VERSION}): upgrade prudent")

    def read(self, statement: sa.Executable, params: dict[str, Any] | None = None) -> list[Any]:
        """All rows of one statement, in one short read."""
        return list(self._read(lambda conn: conn.execute(statement, params or {}).all()))

    def last_values(self, run_id: str, names: list[str]) -> dict[str, float | None]:
        """The newest value of each named metric: ``last_metrics`` for a run whose names are
        known, read backwards from the newest row (one short index walk per name, not a scan
        of a million-row run)."""
        from prudent.store.database import metrics

        found = {}
        for name in names:
            stmt = (sa.select(metrics.c.value).where(metrics.c.run_id == run_id,
                                                     metrics.c.name == name)
                    .order_by(metrics.c.id.desc()).limit(1))
            rows = self.read(stmt)
            found[name] = rows[0][0] if rows else None
        return dict(sorted(found.items()))

    def rollup_covers(self, run_id: str) -> bool:
        """Whether the store's ``metric_rollup`` holds the run's metric rows (it was written by
        a prudent that keeps one): its first and newest rows are each in a rolled-up bucket.
        Two index probes, never a pass over the rows."""
        from prudent.store.database import ROLLUP_WIDTHS, metric_rollup, metrics

        if not self._has_rollup():
            return False
        r, width = metric_rollup.c, ROLLUP_WIDTHS[-1]
        for order in (metrics.c.id, metrics.c.id.desc()):
            row = self.read(sa.select(metrics.c.step, metrics.c.name)
                            .where(metrics.c.run_id == run_id).order_by(order).limit(1))
            if not row:
                return False
            step, name = row[0]
            found = self.read(sa.select(r.id).where(
                r.run_id == run_id, r.width == width, r.bucket == step // width, r.name == name,
                r.first_step <= step, r.last_step >= step).limit(1))
            if not found:
                return False
        return True

    def last_metrics(self, run_id: str) -> dict[str, float | None]:
        """The newest value of each metric of the run (the runs table): from the rollup's few
        widest buckets (the newest by wall time, then step) when it covers the run, else a pass
        over the run's rows (``Store.last_metrics``)."""
        from prudent.store.database import ROLLUP_WIDTHS, metric_rollup

        if not self.rollup_covers(run_id):
            return super().last_metrics(run_id)
        r = metric_rollup.c
        rows = self.read(sa.select(r.name, r.last).where(r.run_id == run_id,
                                                         r.width == ROLLUP_WIDTHS[-1])
                         .order_by(r.wall, r.last_step))
        return dict(sorted(dict(rows).items()))  # the newest of each name wins

    def rollup_names(self, run_id: str) -> set[str] | None:
        """The run's metric names from the rollup (a few rows), None when it has none."""
        from prudent.store.database import ROLLUP_WIDTHS, metric_rollup

        if not self.rollup_covers(run_id):
            return None
        r = metric_rollup.c
        rows = self.read(sa.select(r.name).distinct().where(r.run_id == run_id,
                                                            r.width == ROLLUP_WIDTHS[-1]))
        return {row[0] for row in rows}

    def _has_rollup(self) -> bool:
        """The rollup table is there, of this prudent's shape (another is read around)."""
        from prudent.store.database import metric_rollup

        def shaped(conn: sa.Connection) -> bool:
            inspector = sa.inspect(conn)
            return inspector.has_table("metric_rollup") and {
                c["name"] for c in inspector.get_columns("metric_rollup")} == set(
                metric_rollup.c.keys())

        if not getattr(self, "_rollup_seen", False):  # once there, it stays
            self._rollup_seen = self._read(shaped)
        return self._rollup_seen

    def metrics_token(self, run_id: str) -> str:
        """Changes whenever the run gains a metric or an event: what the live page polls."""
        from prudent.store.database import events, metrics

        newest = sa.select(sa.func.coalesce(sa.func.max(metrics.c.id), 0)).where(
            metrics.c.run_id == run_id).scalar_subquery()
        newest_event = sa.select(sa.func.coalesce(sa.func.max(events.c.id), 0)).where(
            events.c.run_id == run_id).scalar_subquery()
        row = self.read(sa.select(newest, newest_event))[0]
        return f"{row[0]}.{row[1]}"  # the newest metric's and event's ids


def open_readonly(settings_store: Any) -> ReadOnlyStore:
    """The store of ``store:`` settings, read-only; a clear error when there is none yet."""
    url = settings_store.url
    if url is None:
        path = Path(settings_store.home).resolve() / "prudent.db"
        if not path.exists():
            raise ConfigError(f"no run store at {path}: run something first (prudent run -- "
                              "python train.py), or point PRUDENT_HOME / store.url at the store")
        url = f"sqlite:///{path}"
    return ReadOnlyStore(url)


def _readonly_engine(url: str) -> sa.Engine:
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True, connect_args={
            "connect_timeout": 10, "options": "-c default_transaction_read_only=on"})
    path = Path(parsed.database or "").resolve()
    # a store on read-only media (an archive, a read-only mount): SQLite cannot make the
    # shared-memory file of its write-ahead log there; nothing can change it either, so it is
    # opened as immutable
    mode = "mode=ro" if os.access(path.parent, os.W_OK) else "mode=ro&immutable=1"
    engine = sa.create_engine(f"sqlite:///file:{path}?{mode}&uri=true",
                              connect_args={"timeout": 30, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # autocommit: each SELECT is its own short snapshot
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA query_only=1")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine
