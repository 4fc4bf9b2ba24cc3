"""The viewer's store is read-only, and a writer holding the database never makes it fail."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from prudent.kernel.errors import ConfigError, StoreError
from prudent.report.reader import ReadOnlyStore, open_readonly
from prudent.store.database import Store, StoreSettings


def test_the_viewer_cannot_write(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'prudent.db'}"
    Store(url).close()
    reader = ReadOnlyStore(url)
    with pytest.raises(StoreError, match="readonly|read-only|attempt to write"):
        reader.read(sa.text("DELETE FROM runs"))
    reader.close()


def test_reads_go_on_while_a_writer_holds_the_database(tmp_path: Path) -> None:
    path = tmp_path / "prudent.db"
    writer = Store(f"sqlite:///{path}")
    writer.create_run("r", "r")
    reader = ReadOnlyStore(f"sqlite:///{path}")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a long write transaction, as a big flush would be
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO metrics (run_id, step, name, value, wall) "
                     "VALUES ('r', 1, 'loss', 1.0, 0)")
        held.set()
        release.wait(10)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    started = time.monotonic()
    assert reader.get_run("r")["status"] == "running"
    assert reader.count_metrics("r") == 0  # the last committed state, at once
    assert time.monotonic() - started < 1.0
    release.set()
    thread.join()
    assert reader.count_metrics("r") == 1
    writer.update_run("r", status="completed")  # and the writer never waits on the reader
    assert reader.get_run("r")["status"] == "completed"
    reader.close()
    writer.close()


def test_a_missing_store_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no run store at .*run something first"):
        open_readonly(StoreSettings(home=str(tmp_path / "nowhere")))


def test_a_store_from_a_newer_prudent_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'prudent.db'}"
    Store(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE schema_info SET version = 99")
    engine.dispose()
    with pytest.raises(StoreError, match="schema version 99, newer"):
        ReadOnlyStore(url)


def test_postgres_sessions_are_read_only(pg_url: str) -> None:
    Store(pg_url).close()
    reader = ReadOnlyStore(pg_url)
    assert reader.list_runs() == []
    with pytest.raises(sa.exc.DBAPIError, match="read-only"):
        reader.read(sa.text("DELETE FROM runs"))
    reader.close()
