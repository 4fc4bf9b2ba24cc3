from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from prudent.errors import StoreError
from prudent.store import SCHEMA_VERSION, Store, StoreWriter, schema_info, to_floats


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path / 'prudent.db'}")
    yield store
    store.close()


def test_new_database_is_migrated_to_current_schema(store: Store) -> None:
    assert store.schema_version() == SCHEMA_VERSION == 1
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_reopening_keeps_data_and_version(store: Store, tmp_path: Path) -> None:
    store.create_run("r1", "one", config={"lr": 0.1})
    again = Store(store.url)
    record = again.get_run("r1")
    assert record is not None and record["config"] == {"lr": 0.1}
    assert again.schema_version() == 1
    again.close()


def test_newer_schema_is_refused_with_upgrade_hint(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(schema_info.update().values(version=SCHEMA_VERSION + 1))
    with pytest.raises(StoreError, match="upgrade prudent"):
        Store(store.url)


def test_run_lifecycle_fields(store: Store) -> None:
    store.create_run("r1", "one", host="h")
    store.update_run("r1", status="stopped", stop_reason="budget")
    store.count_restart("r1")
    record = store.get_run("r1")
    assert record is not None
    assert (record["status"], record["stop_reason"], record["restarts"]) == ("running", None, 1)
    assert store.find_run_ids("r") == ["r1"] and store.find_run_ids("x") == []
    assert [r["id"] for r in store.list_runs()] == ["r1"]


def test_writer_batches_rows_and_flush_commits_them(store: Store) -> None:
    store.create_run("r1", "one")
    writer = StoreWriter(store, flush_interval_s=60)  # only flush() commits
    writer.put_metrics("r1", [(1, 0.0, {"loss": torch.tensor(2.0), "lr": 0.1}),
                              (2, 0.0, {"loss": torch.tensor(1.0)})])
    writer.put_event({"run_id": "r1", "step": 2, "kind": "k", "name": "n", "message": "m",
                      "payload": "{}", "wall": 0.0})
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


def test_to_floats_handles_numbers_tensors_and_none() -> None:
    values = [1, 2.5, None, torch.tensor(3.0), torch.tensor([4.0]), torch.tensor(5, dtype=torch.int64)]
    assert to_floats(values) == [1.0, 2.5, None, 3.0, 4.0, 5.0]


def test_unopenable_store_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open the run store"):
        Store(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")


def test_metrics_table_has_the_documented_columns(store: Store) -> None:
    columns = {c["name"] for c in sa.inspect(store.engine).get_columns("metrics")}
    assert {"run_id", "step", "name", "value", "wall"} <= columns
