"""Downsampling: exact for small series, every extreme kept for big ones, a bounded size."""

from __future__ import annotations

import math
from pathlib import Path

from prudent.report.downsample import envelope, run_series
from prudent.report.reader import ReadOnlyStore
from prudent.store import Store


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
    assert abs(loss["steps"][spike] - 123_457) < n / 500  # drawn where it happened
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
    (loss,) = run_series(reader, "r", 9_999, num_buckets=100)
    reader.close()
    assert loss["count"] == 10_000 and len(loss["steps"]) <= 200
    assert max(loss["values"]) == 2.0 and min(loss["values"]) == 1.0
