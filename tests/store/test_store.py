"""The run store's contract, run against every backend: SQLite and a real PostgreSQL."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.exc import DataError, OperationalError

from prudent.kernel.errors import ConfigError, StoreError, StoreUnavailable
from prudent.store.database import (
    SCHEMA_VERSION,
    Store,
    StoreSettings,
    database_url,
    mask_url,
    schema_info,
)
from prudent.store.writer import StoreWriter, to_floats
from tests.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'prudent.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    store = Store(store_url)
    yield store
    store.close()


def _event(name: str = "n", **fields: Any) -> dict[str, Any]:
    return {"run_id": "r1", "step": 2, "kind": "k", "name": name, "message": "m",
            "payload": "{}", "wall": 0.0, **fields}


def test_new_database_is_migrated_to_current_schema(store: Store) -> None:
    assert store.schema_version() == SCHEMA_VERSION == 2
    if store.engine.dialect.name == "sqlite":
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_reopening_keeps_data_and_version(store: Store, store_url: str) -> None:
    store.create_run("r1", "one", config={"lr": 0.1})
    again = Store(store_url)
    record = again.get_run("r1")
    assert record is not None and record["config"] == {"lr": 0.1}
    assert again.schema_version() == SCHEMA_VERSION
    again.close()


def test_newer_schema_is_refused_with_upgrade_hint(store: Store, store_url: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(schema_info.update().values(version=SCHEMA_VERSION + 1))
    with pytest.raises(StoreError, match="upgrade prudent"):
        Store(store_url)


def test_version_1_database_is_migrated_keeping_its_rows(store: Store, store_url: str) -> None:
    """Version 1 declared VARCHAR(128) names, which PostgreSQL enforces; version 2 widens them."""
    if store.engine.dialect.name == "postgresql":
        with store.engine.begin() as conn:
            for table, column, size in [("runs", "name", 256), ("runs", "host", 256),
                                        ("runs", "stop_reason", 128), ("metrics", "name", 128),
                                        ("events", "kind", 32), ("events", "name", 128)]:
                conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {column} "
                                     f"TYPE VARCHAR({size})")
    with store.engine.begin() as conn:
        conn.execute(schema_info.update().values(version=1))
    store.create_run("old", "kept")
    migrated = Store(store_url)
    assert migrated.schema_version() == SCHEMA_VERSION
    long_name = "train/" + "x" * 300
    migrated.add_metrics([{"run_id": "old", "step": 1, "name": long_name, "value": 1.0,
                           "wall": 0.0}])
    assert migrated.last_metrics("old") == {long_name: 1.0}
    assert (migrated.get_run("old") or {})["name"] == "kept"
    migrated.close()


def test_stores_opened_at_once_migrate_once(store_url: str) -> None:
    opened: list[Store] = []
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            opened.append(Store(store_url))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and [s.schema_version() for s in opened] == [SCHEMA_VERSION] * 4
    for s in opened:
        s.close()


def test_run_lifecycle_fields(store: Store) -> None:
    store.create_run("r1", "one", host="h")
    store.update_run("r1", status="stopped", stop_reason="budget")
    store.count_restart("r1")
    record = store.get_run("r1")
    assert record is not None
    assert (record["status"], record["stop_reason"], record["restarts"]) == ("running", None, 1)
    assert store.find_run_ids("r") == ["r1"] and store.find_run_ids("x") == []
    assert store.find_run_ids("r%") == []  # LIKE wildcards in a prefix are plain characters
    assert [r["id"] for r in store.list_runs()] == ["r1"]


def test_steps_read_live_while_running_and_after_a_kill(store: Store) -> None:
    """A run writes its step count when it ends: until then (and when it was killed before
    it could) its step is as far as its metrics went."""
    for run_id in ("running", "killed", "done"):
        store.create_run(run_id, run_id)
        store.add_records([{"run_id": run_id, "step": step, "name": "loss", "value": 1.0,
                            "wall": float(step)} for step in range(1, 301)], [])
    store.close_if_running("killed", status="failed", stop_reason="killed")
    store.close_if_running("done", status="completed", step=320)  # the last 20 logged nothing
    assert {r["id"]: r["step"] for r in store.list_runs()} == {
        "running": 300, "killed": 300, "done": 320}
    assert store.get_run("running")["step"] == 300  # type: ignore[index]
    store.create_run("fresh", "fresh")
    assert store.get_run("fresh")["step"] == 0  # type: ignore[index]


def test_a_run_its_own_process_closed_is_not_closed_again(store: Store) -> None:
    store.create_run("r1", "one", host="h")
    assert store.close_if_running("r1", status="stopped", stop_reason="rule:non_finite")
    assert not store.close_if_running("r1", status="stopped", stop_reason="rule:unknown")
    record = store.get_run("r1")
    assert record is not None and record["stop_reason"] == "rule:non_finite"


def test_creating_a_run_another_machine_created_counts_an_attempt(store: Store) -> None:
    store.create_run("r1", "one", host="machine-a")
    store.create_run("r1", "one", host="machine-b")
    record = store.get_run("r1")
    assert record is not None and (record["restarts"], record["host"]) == (1, "machine-b")


def test_machines_creating_one_run_at_once_each_count_an_attempt(store_url: str) -> None:
    stores = [Store(store_url) for _ in range(4)]
    barrier = threading.Barrier(4)

    def create(store: Store) -> None:
        barrier.wait()
        if store.get_run("r1") is None:  # as prudent run does: all four may see no run yet
            store.create_run("r1", "one")
        else:
            store.count_restart("r1")

    threads = [threading.Thread(target=create, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (stores[0].get_run("r1") or {})["restarts"] == 3
    for s in stores:
        s.close()


def test_writer_batches_rows_and_flush_commits_them(store: Store) -> None:
    store.create_run("r1", "one")
    writer = StoreWriter(store, flush_interval_s=60)  # only flush() commits
    writer.put_metrics("r1", [(1, 0.0, {"loss": torch.tensor(2.0), "lr": 0.1}),
                              (2, 0.0, {"loss": torch.tensor(1.0)})])
    writer.put_event(_event())
    writer.flush()
    assert store.metric_series("r1", "loss") == [(1, 2.0), (2, 1.0)]
    assert store.last_metrics("r1") == {"loss": 1.0, "lr": 0.1}
    assert writer.latest == {"loss": 1.0, "lr": 0.1}
    assert [e["name"] for e in store.events("r1")] == ["n"]
    writer.close()


def test_writer_survives_a_bad_metric(store: Store) -> None:
    writer = StoreWriter(store, flush_interval_s=60)
    writer.put_metrics("r1", [(1, 0.0, {"loss": "not a number"})])
    writer.put_metrics("r1", [(2, 0.0, {"loss": 1.5})])
    writer.close()
    assert writer.num_errors == 1 and store.metric_series("r1", "loss") == [(2, 1.5)]


def test_threads_writing_at_once_lose_no_rows(store: Store) -> None:
    def write(run_id: str) -> None:
        for start in range(0, 1000, 100):
            store.add_metrics([{"run_id": run_id, "step": i, "name": "x", "value": 1.0,
                                "wall": 0.0} for i in range(start, start + 100)])

    threads = [threading.Thread(target=write, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.count_metrics() == 4000


def test_metrics_table_has_the_documented_columns(store: Store) -> None:
    columns = {c["name"] for c in sa.inspect(store.engine).get_columns("metrics")}
    assert {"run_id", "step", "name", "value", "wall"} <= columns


def test_passwords_are_masked_in_records(store: Store) -> None:
    secret = "postgresql://alice:hunter2@db.example:5432/runs"
    store.create_run("r1", "one", config={"store": {"url": secret}})
    store.update_run("r1", config={"store": {"url": secret}, "urls": [secret]})
    store.add_events([_event(message=f"opened {secret}", payload=f'{{"url": "{secret}"}}')])
    text = repr(store.get_run("r1")) + repr(store.events("r1"))
    assert "hunter2" not in text and "alice:***@db.example" in text


# Without a database -------------------------------------------------------------------------

def test_to_floats_handles_numbers_tensors_and_none() -> None:
    values = [1, 2.5, None, torch.tensor(3.0), torch.tensor([4.0]), torch.tensor(5, dtype=torch.int64)]
    assert to_floats(values) == [1.0, 2.5, None, 3.0, 4.0, 5.0]


def test_unopenable_store_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open the run store .*PRUDENT_HOME"):
        Store(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")


def test_unreachable_server_is_one_line_naming_the_url_without_its_password() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError) as raised:
        Store("postgresql://alice:hunter2@127.0.0.1:1/runs")
    message = str(raised.value)
    assert "\n" not in message and "hunter2" not in message
    assert "postgresql://alice:***@127.0.0.1:1/runs:" in message
    assert "PRUDENT_STORE_URL" in message


def test_plain_postgresql_urls_use_psycopg_3() -> None:
    pytest.importorskip("psycopg")
    assert database_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert database_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert database_url("sqlite:///x.db") == "sqlite:///x.db"
    with pytest.raises(ConfigError, match="not a database URL"):
        database_url("nonsense")


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("at postgresql+psycopg://bob:s3cr@t@h:5/d ok") == \
        "at postgresql+psycopg://bob:***@h:5/d ok"
    assert mask_url("sqlite:////tmp/x.db and http://h:80/p") == "sqlite:////tmp/x.db and http://h:80/p"


class FlakyStore:
    """A store whose database is away for the first ``down`` writes."""

    url = "postgresql+psycopg://u:***@db/runs"

    def __init__(self, down: int, refuse: bool = False) -> None:
        self.down, self.refuse = down, refuse
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def add_records(self, metric_rows: list[dict[str, Any]],
                    event_rows: list[dict[str, Any]]) -> None:
        if self.down > 0:
            self.down -= 1
            error = DataError if self.refuse else OperationalError
            raise error("INSERT", {}, Exception("server closed the connection unexpectedly"))
        self.metrics += metric_rows
        self.events += event_rows


def _log_steps(writer: StoreWriter, first: int, last: int) -> None:
    for step in range(first, last):
        writer.put_metrics("r1", [(step, 0.0, {"loss": float(step)})])
        writer.flush()  # one commit attempt per step


def test_writer_keeps_rows_while_the_database_is_away(caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore(down=5)
    writer = StoreWriter(store, flush_interval_s=0.05)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "prudent.store"):
        _log_steps(writer, 0, 10)
        writer.close()
    assert [r["step"] for r in store.metrics] == list(range(10)) and writer.num_dropped == 0
    assert "answers again after" in caplog.text and "6 waiting rows written, 0 dropped" in caplog.text
    (outage,) = store.events  # the run's own record says so, not only the log
    assert (outage["kind"], outage["name"], outage["run_id"]) == ("store", "outage", "r1")
    assert json.loads(outage["payload"]) == {"seconds": pytest.approx(0.25, abs=5.0),
                                             "rows_written": 6, "rows_dropped": 0}


def test_writer_past_its_bound_drops_the_oldest_and_says_how_many(
        caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore(down=10)
    writer = StoreWriter(store, flush_interval_s=0.05, max_buffered_rows=4)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "prudent.store"):
        _log_steps(writer, 0, 10)
        writer.put_event(_event())
        writer.close()
    assert [r["step"] for r in store.metrics] == [7, 8, 9]
    assert [e["name"] for e in store.events] == ["n", "outage"]
    assert json.loads(store.events[-1]["payload"])["rows_dropped"] == 7
    assert writer.num_dropped == 7 and "waiting rows written, 7 dropped" in caplog.text


def test_writer_drops_a_refused_batch_and_goes_on() -> None:
    store = FlakyStore(down=1, refuse=True)
    writer = StoreWriter(store, flush_interval_s=0.05)  # type: ignore[arg-type]
    _log_steps(writer, 0, 3)
    writer.close()
    assert [r["step"] for r in store.metrics] == [1, 2]
    assert (writer.num_dropped, writer.num_errors) == (1, 1)


def test_writer_gives_up_at_close_and_counts_what_it_could_not_write(
        caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore(down=10**6)
    writer = StoreWriter(store, flush_interval_s=0.05)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "prudent.store"):
        _log_steps(writer, 0, 3)
        writer.close(timeout_s=1.5)
    assert writer.num_dropped == 3 and not store.metrics
    assert "dropped 3 metric rows and 0 events" in caplog.text


def test_server_restart_is_survived_by_an_open_store(postgres: PostgresServer,
                                                     pg_url: str) -> None:
    store = Store(pg_url)
    store.create_run("r1", "one")
    postgres.stop()
    postgres.start()
    store.update_run("r1", status="completed")  # the pool's dead connections are replaced
    assert (store.get_run("r1") or {})["status"] == "completed"
    store.close()


def test_a_write_waits_for_a_server_that_comes_back(postgres: PostgresServer,
                                                    pg_url: str) -> None:
    store = Store(pg_url)
    store.create_run("r1", "one")
    postgres.stop()
    timer = threading.Timer(1.5, postgres.start)
    timer.start()
    try:
        store.update_run("r1", status="completed")  # the end of a run, during a restart
    finally:
        timer.join()
    assert (store.get_run("r1") or {})["status"] == "completed"
    store.close()


def test_a_write_gives_up_when_the_server_stays_away(postgres: PostgresServer,
                                                     pg_url: str) -> None:
    import time

    store = Store.open(StoreSettings(url=pg_url, unreachable_wait_s=0.5))  # store: in prudent.yaml
    postgres.stop()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="cannot use the run store .*refused"):
            store.update_run("r1", status="completed")  # a StoreError callers catch
        assert 0.5 <= time.monotonic() - started < 10  # the setting's wait, not the default 30 s
    finally:
        postgres.start()
    store.close()


def test_a_server_gone_for_good_costs_one_wait_not_one_per_call(postgres: PostgresServer,
                                                               pg_url: str) -> None:
    import time

    store = Store(pg_url)
    store.create_run("r1", "one")
    store.unreachable_wait_s = 1.5
    writer = StoreWriter(store, flush_interval_s=0.05)
    postgres.stop()
    try:
        took = []
        for call in (lambda: store.update_run("r1", step=3), lambda: store.get_run("r1")):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            took.append(time.monotonic() - started)
        writer.put_metrics("r1", [(3, 0.0, {"loss": 1.0})])
        started = time.monotonic()
        writer.close()  # the run's end: the server has had its wait already
        took.append(time.monotonic() - started)
    finally:
        postgres.start()
    assert took[0] >= 1.5 and took[1] < 1.0 and took[2] < 1.0, took
    assert writer.num_dropped == 1
    store.update_run("r1", step=4)  # back: it answers, and a later outage is waited for again
    assert store.wait_left_s() is None and (store.get_run("r1") or {})["step"] == 4
    store.close()


def test_metric_rows_are_rolled_up_with_them_and_forgotten_with_the_run(store: Store) -> None:
    from prudent.store.database import ROLLUP_WIDTHS, metric_rollup

    store.create_run("r1", "one")
    rows = [{"run_id": "r1", "step": s, "name": "loss", "wall": float(s),
             "value": float("nan") if s == 500 else float(s % 97)} for s in range(1000)]
    total = sum(float(s % 97) for s in range(1000) if s != 500)
    store.add_metrics(rows[:333])  # a bucket across two batches: two rows, merged when read
    store.add_records(rows[333:], [])
    r = metric_rollup.c
    for width in ROLLUP_WIDTHS:
        stmt = sa.select(sa.func.sum(r.num), sa.func.sum(r.num_values), sa.func.min(r.first_step),
                         sa.func.max(r.last_step), sa.func.min(r.low), sa.func.max(r.high),
                         sa.func.sum(r.total), sa.func.max(r.wall)
                         ).where(r.run_id == "r1", r.width == width)
        with store.engine.connect() as conn:
            assert tuple(conn.execute(stmt).one()) == (1000, 999, 0, 999, 0.0, 96.0, total,
                                                       999.0), width
    with store.engine.connect() as conn:  # one row per bucket, whatever the batches
        counts = dict(conn.execute(sa.select(r.width, sa.func.count()).group_by(r.width)).all())
        assert counts == {w: -(-1000 // w) for w in ROLLUP_WIDTHS}
    store.add_metrics([{**rows[-1], "step": 1000, "value": 7.0}])  # a slow run's next batch
    with store.engine.connect() as conn:
        newest = conn.execute(sa.select(r.num, r.last, r.high).where(r.width == ROLLUP_WIDTHS[-1])
                              ).one()
        assert tuple(newest) == (1001, 7.0, 96.0)
    store.delete_run("r1")
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(metric_rollup)).scalar() == 0


def test_a_rollup_table_of_another_shape_is_made_anew(store: Store, store_url: str) -> None:
    """It holds only what the metric rows give again: an older shape (a prudent from before a
    column was added) is dropped and made anew; viewers read the runs it covered raw."""
    from prudent.store.database import metric_rollup

    with store.engine.begin() as conn:
        metric_rollup.drop(conn)
        conn.exec_driver_sql("CREATE TABLE metric_rollup (id INTEGER PRIMARY KEY, "
                             "run_id VARCHAR(128) NOT NULL)")
    again = Store(store_url)
    again.create_run("r1", "one")
    again.add_metrics([{"run_id": "r1", "step": 1, "name": "loss", "value": 1.0, "wall": 0.0}])
    with again.engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("metric_rollup")}
        assert columns == set(metric_rollup.c.keys())
        assert conn.execute(sa.select(sa.func.count()).select_from(metric_rollup)).scalar() == 7
    again.close()


def test_a_nan_metric_reads_back_as_a_gap_on_every_database(store: Store, store_url: str) -> None:
    """SQLite turns a NaN into NULL; PostgreSQL would keep it, and its max() sorts NaN above
    every number: a short run's curve (read raw) then held NaN where SQLite's has a gap, and
    `prudent show` printed nan for a last value SQLite shows as missing."""
    from prudent.report.downsample import run_series
    from prudent.report.reader import ReadOnlyStore

    store.create_run("r1", "one")
    store.add_metrics([{"run_id": "r1", "step": s, "name": "loss", "wall": float(s),
                        "value": float("nan") if s == 3 else float(s)} for s in range(6)]
                      + [{"run_id": "r1", "step": 6, "name": "val_loss", "wall": 6.0,
                          "value": float("nan")}])
    reader = ReadOnlyStore(store_url)
    [loss, val_loss] = sorted(run_series(reader, "r1", last_step=6), key=lambda s: s["name"])
    reader.engine.dispose()
    assert loss["values"] == [0.0, 1.0, 2.0, None, 4.0, 5.0]
    assert val_loss["values"] == [None]
    assert store.last_metrics("r1") == {"loss": 5.0, "val_loss": None}
    assert store.metric_series("r1", "loss")[3] == (3, None)


def test_a_store_locked_by_another_process_is_said_after_5_s_once(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import sqlite3
    import threading

    path = tmp_path / "prudent.db"
    store = Store(f"sqlite:///{path}")
    store.create_run("r1", "one")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # an open sqlite3 shell's write transaction
    release = threading.Timer(6.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        store.update_run("r1", status="completed")  # waits for the lock, then goes on
    finally:
        release.join()
        holder.close()
    err = capfd.readouterr().err
    assert err.count("waiting for the run store") == 1, err
    assert "another process holds its lock" in err
    assert store.get_run("r1")["status"] == "completed"  # type: ignore[index]
    store.update_run("r1", status="completed")  # no wait: nothing said
    assert "waiting" not in capfd.readouterr().err
    store.close()


def test_a_corrupt_store_is_named_corrupt_with_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "prudent.db"
    path.write_bytes(b"this is not SQLite" * 400)
    with pytest.raises(StoreError, match=r"is corrupt \(file is not a database\): repair it with "
                                         r"`prudent store repair` .* or move it aside "
                                         rf"\(mv {re.escape(str(path))} .*\.corrupt\)"):
        Store.open(StoreSettings(home=str(tmp_path)))


def test_an_emptied_store_says_its_runs_are_gone(tmp_path: Path,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prudent.db").write_bytes(b"")
    Store.open(StoreSettings(home=str(tmp_path))).close()
    assert "is empty (0 bytes): the runs it held are gone" in capfd.readouterr().err
    Store.open(StoreSettings(home=str(tmp_path))).close()  # made anew: said once
    assert "empty" not in capfd.readouterr().err
