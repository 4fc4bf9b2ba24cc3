"""Downsampling: exact for small series, every extreme kept for big ones, a bounded size."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sqlalchemy as sa

from prudent.report.downsample import envelope, profile_timeline, run_series
from prudent.report.reader import ReadOnlyStore
from prudent.store.database import Store, metric_rollup


def _store_with(tmp_path: Path, rows: list[tuple[int, str, float]], last_step: int) -> str:
    url = f"sqlite:///{tmp_path / 'prudent.db'}"
    store = Store(url)
    store.create_run("r", "r", step=last_step)
    store.add_metrics([{"run_id": "r", "step": s, "name": n, "value": v, "wall": 0.0}
                       for s, n, v in rows])
    store.close()
    return url


def test_a_series_shorter_than_the_buckets_comes_back_exactly(tmp_path: Path) -> None:
    rows = [(s, "loss", 1.0 / s) for s in range(1, 301)] + [(s, "val_acc", s / 300)
                                                             for s in range(30, 301, 30)]
    store = ReadOnlyStore(_store_with(tmp_path, rows, 300))
    series = {s["name"]: s for s in run_series(store, "r", 300)}
    store.close()
    assert series["loss"]["steps"] == list(range(1, 301))
    assert series["loss"]["values"] == [float(f"{1.0 / s:.7g}") for s in range(1, 301)]
    assert not series["loss"]["downsampled"]
    assert series["val_acc"]["steps"] == list(range(30, 301, 30))


def test_a_long_series_keeps_every_spike_and_dip_in_a_bounded_size(tmp_path: Path) -> None:
    n = 200_000
    values = [1.0 + 0.01 * math.sin(s / 50) for s in range(n)]
    values[123_457] = 50.0  # one spike
    values[7] = -3.0  # one dip
    store = ReadOnlyStore(_store_with(tmp_path, [(s, "loss", v) for s, v in enumerate(values)],
                                      n - 1))
    (loss,) = run_series(store, "r", n - 1, num_buckets=500)
    store.close()
    assert loss["downsampled"] and loss["count"] == n
    assert len(loss["steps"]) <= 1000
    assert max(loss["values"]) == 50.0 and min(loss["values"]) == -3.0
    spike = loss["values"].index(50.0)
    # drawn where it happened: in its range, n / 500 steps rounded up to the rollup's widths
    assert abs(loss["steps"][spike] - 123_457) < 1.25 * n / 500
    assert loss["steps"] == sorted(loss["steps"])


def test_missing_values_break_the_line() -> None:
    # (count, first step, last step, min, max, finite count); NaN is stored as NULL
    series = envelope("loss", [(1, 1, 1, 2.0, 2.0, 1), (1, 2, 2, None, None, 0),
                               (1, 3, 3, 1.0, 1.0, 1), (2, 4, 5, float("inf"), float("inf"), 2)])
    assert series["steps"] == [1, 2, 3, 5]
    assert series["values"] == [2.0, None, 1.0, None]


def test_the_same_series_from_postgresql(pg_url: str) -> None:
    store = Store(pg_url)
    store.create_run("r", "r", step=9_999)
    store.add_metrics([{"run_id": "r", "step": s, "name": "loss", "value": 1.0 + (s == 4321),
                        "wall": 0.0} for s in range(10_000)])
    store.close()
    reader = ReadOnlyStore(pg_url)
    assert reader.rollup_covers("r")  # read from the rollup, as SQLite is
    (loss,) = run_series(reader, "r", 9_999, num_buckets=100)
    reader.close()
    assert loss["count"] == 10_000 and len(loss["steps"]) <= 200
    assert max(loss["values"]) == 2.0 and min(loss["values"]) == 1.0


def _long_run(tmp_path: Path, n: int, batch: int) -> str:
    """A run written as the writer thread writes it: in batches, so that rolled-up buckets
    span batches (two partial rows each, merged when read); some values missing (NaN)."""
    url = f"sqlite:///{tmp_path / 'prudent.db'}"
    store = Store(url)
    store.create_run("r", "r", step=n - 1)
    rows = [{"run_id": "r", "step": s, "name": "loss", "wall": 0.0,
             "value": float("nan") if 5000 <= s < 5700 else 5.0 if s == 77_777 else math.cos(s / 900)}
            for s in range(n)]
    for start in range(0, n, batch):
        store.add_metrics(rows[start:start + batch])
    store.close()
    return url


def test_the_rollup_draws_what_the_rows_draw(tmp_path: Path) -> None:
    n = 256 * 400  # 400 buckets of 256 steps: the rollup's width, so both read the same ranges
    store = ReadOnlyStore(_long_run(tmp_path, n, batch=3_333))
    assert store.rollup_covers("r")
    assert store.last_metrics("r") == Store.last_metrics(store, "r") == {"loss": math.cos(
        (n - 1) / 900)}  # the runs table's value, from the rollup as from the rows
    (rolled,) = run_series(store, "r", n - 1, num_buckets=400)
    store.rollup_covers = lambda run_id: False  # type: ignore[method-assign]
    (raw,) = run_series(store, "r", n - 1, num_buckets=400)
    store.close()
    assert rolled == raw
    assert rolled["count"] == n and max(v for v in rolled["values"] if v is not None) == 5.0
    assert None in rolled["values"]  # the missing stretch is a gap


def test_a_run_written_before_the_rollup_is_read_from_its_rows(tmp_path: Path) -> None:
    n = 60_000
    url = _long_run(tmp_path, n, batch=20_000)
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # its first batch predates the rollup
        conn.execute(metric_rollup.delete().where(metric_rollup.c.first_step < 20_000))
    engine.dispose()
    store = ReadOnlyStore(url)
    assert not store.rollup_covers("r") and store.rollup_names("r") is None
    (loss,) = run_series(store, "r", n - 1, num_buckets=500)
    store.close()
    assert loss["count"] == n and loss["downsampled"]


def test_a_store_from_before_the_rollup_gains_it_and_still_reads(tmp_path: Path) -> None:
    url = _long_run(tmp_path, 30_000, batch=30_000)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE metric_rollup")
    engine.dispose()
    store = ReadOnlyStore(url)  # a viewer never creates it: it reads the rows
    (loss,) = run_series(store, "r", 29_999, num_buckets=500)
    assert loss["count"] == 30_000 and not store.rollup_covers("r")
    store.close()
    Store(url).close()  # the next writer to open the store adds the table
    assert sa.inspect(sa.create_engine(url)).has_table("metric_rollup")


def test_a_long_run_has_its_profile_timeline_from_the_rollup(tmp_path: Path) -> None:
    """40,000 steps, the profiler's samples every 10 steps: its 100-point timeline comes from
    the rollup (256-step buckets, finer than the timeline's) and matches the rows'."""
    url = f"sqlite:///{tmp_path / 'prudent.db'}"
    store = Store(url)
    store.create_run("r", "r", step=40_000, started_at=0.0)
    rows = [{"run_id": "r", "step": s, "name": "loss", "value": 1.0, "wall": s * 0.1}
            for s in range(1, 40_001)]
    rows += [{"run_id": "r", "step": s, "name": f"profile/{n}", "value": v + s / 1000,
              "wall": s * 0.1} for s in range(10, 40_001, 10) for n, v in (("cpu_pct", 50.0),
                                                                          ("rss_mb", 900.0))]
    rows.sort(key=lambda r: r["step"])
    for start in range(0, len(rows), 7_000):
        store.add_metrics(rows[start:start + 7_000])
    store.close()
    reader = ReadOnlyStore(url)
    rolled = profile_timeline(reader, "r", 0.0, max_points=100, last_step=40_000)
    raw = profile_timeline(reader, "r", 0.0, max_points=100)  # too short for the rollup: rows
    reader.rollup_covers = lambda run_id: False  # type: ignore[method-assign]
    assert profile_timeline(reader, "r", 0.0, max_points=100, last_step=40_000) == raw
    reader.close()
    assert 95 <= len(rolled) <= 101 and 95 <= len(raw) <= 101
    for a, b in zip(rolled[::10], raw[::10]):  # the same time, step and means, within a bucket
        assert abs(a["t"] - b["t"]) <= 40 and abs(a["step"] - b["step"]) <= 400
        assert a["cpu_pct"] == pytest.approx(b["cpu_pct"], abs=0.5)
        assert a["rss_mb"] == pytest.approx(b["rss_mb"], abs=0.5)
    assert rolled[-1]["step"] == raw[-1]["step"] == 40_000


def test_a_rollup_of_another_shape_is_read_around(tmp_path: Path) -> None:
    """A store whose rollup a different prudent wrote (another shape; the viewer never
    migrates): the curves and the runs table come from the rows."""
    url = _long_run(tmp_path, 30_000, batch=30_000)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE metric_rollup DROP COLUMN last")
    engine.dispose()
    store = ReadOnlyStore(url)
    assert not store.rollup_covers("r")
    (loss,) = run_series(store, "r", 29_999, num_buckets=500)
    assert loss["count"] == 30_000 and store.last_metrics("r") == {"loss": math.cos(29_999 / 900)}
    store.close()
