"""The queries the record needs that the store has no method for: rows past a cursor, and the
keys of the rows already there. Read-only, on the store's own tables (writes go through the
store's public methods)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from prudent.store.database import Store, events, metrics

__all__ = ["Cursor", "event_key", "local_keys", "metric_key", "newest_ids", "rows_after"]

Cursor = tuple[int, int]  # the newest event id and metric id already exported


def event_key(row: list[Any]) -> tuple[Any, ...]:
    """step, kind, name, wall: what makes an event the same event on every machine."""
    return (int(row[0]), row[1], row[2], float(row[5]))


def metric_key(row: list[Any]) -> tuple[Any, ...]:
    return (int(row[0]), row[1], float(row[3]))


def newest_ids(store: Store, run_id: str) -> Cursor:
    with store.engine.connect() as conn:
        event_id = conn.execute(sa.select(sa.func.max(events.c.id))
                                .where(events.c.run_id == run_id)).scalar()
        metric_id = conn.execute(sa.select(sa.func.max(metrics.c.id))
                                 .where(metrics.c.run_id == run_id)).scalar()
    return int(event_id or 0), int(metric_id or 0)


def rows_after(store: Store, run_id: str, cursor: Cursor, upto: Cursor | None = None
               ) -> tuple[list[list[Any]], list[list[Any]], Cursor]:
    """Events and metrics of ``run_id`` with ids past ``cursor`` (up to ``upto``), as segment
    rows, and the cursor after them."""
    e_stmt = (sa.select(events.c.id, events.c.step, events.c.kind, events.c.name,
                        events.c.message, events.c.payload, events.c.wall)
              .where(events.c.run_id == run_id, events.c.id > cursor[0]).order_by(events.c.id))
    m_stmt = (sa.select(metrics.c.id, metrics.c.step, metrics.c.name, metrics.c.value,
                        metrics.c.wall)
              .where(metrics.c.run_id == run_id, metrics.c.id > cursor[1]).order_by(metrics.c.id))
    if upto is not None:
        e_stmt = e_stmt.where(events.c.id <= upto[0])
        m_stmt = m_stmt.where(metrics.c.id <= upto[1])
    with store.engine.connect() as conn:
        event_rows = [list(r) for r in conn.execute(e_stmt)]
        metric_rows = [list(r) for r in conn.execute(m_stmt)]
    new_cursor = (event_rows[-1][0] if event_rows else cursor[0],
                  metric_rows[-1][0] if metric_rows else cursor[1])
    return [r[1:] for r in event_rows], [r[1:] for r in metric_rows], new_cursor


def local_keys(store: Store, run_id: str) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """The keys of the events and metrics this store already holds for ``run_id``."""
    e_stmt = sa.select(events.c.step, events.c.kind, events.c.name, events.c.wall).where(
        events.c.run_id == run_id)
    m_stmt = sa.select(metrics.c.step, metrics.c.name, metrics.c.wall).where(
        metrics.c.run_id == run_id)
    with store.engine.connect() as conn:
        event_keys = {(int(s), k, n, float(w)) for s, k, n, w in conn.execute(e_stmt)}
        metric_keys = {(int(s), n, float(w)) for s, n, w in conn.execute(m_stmt)}
    return event_keys, metric_keys
