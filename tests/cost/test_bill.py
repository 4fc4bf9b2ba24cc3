"""The bill on a store holding runs of every ending."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prudent.cost.bill import bill, since_timestamp
from prudent.kernel.errors import ConfigError
from prudent.store.database import Store

T0 = 1_796_000_000.0
PRICE = {"instance": "aws:g5.xlarge", "spot": False, "nodes": 1, "gpus": 1, "hourly_usd": 3600.0,
         "on_demand_hourly_usd": 3600.0}  # $1 a second keeps the arithmetic readable
SPOT = {**PRICE, "instance": "aws:p3.2xlarge", "spot": True, "hourly_usd": 1800.0}


def _event(run_id: str, wall: float, kind: str, name: str, **payload: Any) -> dict[str, Any]:
    return {"run_id": run_id, "step": 0, "kind": kind, "name": name, "message": "",
            "payload": json.dumps(payload), "wall": wall}


def _attempt(run_id: str, start: float, seconds: float, price: dict[str, Any],
             status: str | None, saved_after: float | None = None,
             **progress: int) -> list[dict[str, Any]]:
    rows = [_event(run_id, start, "cost", "price", **price)]
    if saved_after is not None:
        rows.append(_event(run_id, start + saved_after, "checkpoint", "saved"))
    rows.append(_event(run_id, start + seconds, "metrics", "tick"))
    if status is not None:  # None: killed before it could say how it ended
        rows.append(_event(run_id, start + seconds, "lifecycle", "end", status=status))
        rows.append(_event(run_id, start + seconds, "cost", "meter", attempt_s=seconds, **price,
                           **progress))
    return rows


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'bill.db'}")
    runs = [  # id, name, day offset, stop reason, cost, events
        ("done", "digits", 0, None, 100.0, _attempt("done", T0, 100, PRICE, "completed") +
         [_event("done", T0 + 100, "profile", "summary", breakdown={"data": {"s": 12.5}})]),
        ("spot", "digits", 0, None, 50.0, _attempt("spot", T0, 100, SPOT, "completed")),
        ("crash", "resnet", 0, "error", 30.0, _attempt("crash", T0, 30, PRICE, "failed", 20)),
        ("rule", "resnet", 1, "rule:divergence", 40.0,
         _attempt("rule", T0, 40, PRICE, "stopped", steps_done=100, planned_steps=1000)),
        ("pruned", "tune", 1, "pruned", 10.0,  # no planned steps known: counts as spent
         _attempt("pruned", T0, 10, PRICE, "stopped", steps_done=5, planned_steps=None)),
        ("relaunched", "resnet", 1, None, 70.0,
         _attempt("relaunched", T0, 25, PRICE, None, 10) +
         _attempt("relaunched", T0 + 100, 45, PRICE, "completed", 30)),
        ("budget", "digits", 2, "budget", 20.0, _attempt("budget", T0, 20, PRICE, "stopped", 19)),
    ]
    for run_id, name, day, reason, usd, events in runs:
        store.create_run(run_id, name, started_at=T0 + day * 86400, cost_usd=usd,
                         stop_reason=reason)
        store.add_events(events)
    yield store
    store.close()


def test_the_bill_totals_spent_wasted_stopped_early_and_saved(store: Store) -> None:
    total, lines = bill(store)
    assert total.runs == 7 and total.spent_usd == pytest.approx(320.0)
    # crash: 10 s after its checkpoint; relaunched: first attempt killed 15 s after its checkpoint
    assert total.wasted_crash_usd == pytest.approx(25.0)
    assert total.stopped_early_usd == pytest.approx(50.0)  # the rule's 40 and the pruned 10
    # the rule stopped at step 100 of 1,000: $400 to the end, $360 of it not spent
    assert total.stopped_early_full_usd == pytest.approx(410.0)
    assert total.saved_early_stop_usd == pytest.approx(360.0)
    assert total.saved_spot_usd == pytest.approx(50.0)  # 100 s at $1/s on demand vs $0.5/s spot
    assert total.data_wait_usd == pytest.approx(12.5)  # the profiler saw 12.5 s waiting for data
    assert [line.key for line in lines][:2] == ["done", "relaunched"]  # dearest first


@pytest.mark.parametrize(("by", "keys"), [
    ("name", {"digits": 170.0, "resnet": 140.0, "tune": 10.0}),
    ("instance", {"aws:g5.xlarge": 270.0, "aws:p3.2xlarge": 50.0}),
    ("day", {"2026-11-30": 180.0, "2026-12-01": 120.0, "2026-12-02": 20.0}),
])
def test_the_bill_groups_by_name_instance_and_day(store: Store, by: str,
                                                  keys: dict[str, float]) -> None:
    _, lines = bill(store, by=by)
    assert {line.key: line.spent_usd for line in lines} == pytest.approx(keys)


def test_groups_say_their_instance(store: Store) -> None:
    _, lines = bill(store, by="instance")
    assert {line.key: line.instance for line in lines} == {
        "aws:g5.xlarge": "aws:g5.xlarge", "aws:p3.2xlarge": "aws:p3.2xlarge"}
    _, lines = bill(store, by="name")  # digits ran on both: no one instance
    assert {line.key: line.instance for line in lines}["digits"] is None


def test_a_vanished_machine_is_billed_to_its_last_heartbeat_not_to_the_next_machine(
        tmp_path: Path) -> None:
    # machine 1 vanished 16 s in (its last heartbeat; saved at 10 s); machine 2 started at
    # 30 s, imported the record (record_lost) and wrote its lifecycle start before its price
    store = Store(f"sqlite:///{tmp_path / 'vanished.db'}")
    try:
        store.create_run("spot", "digits", started_at=T0, cost_usd=55.0)
        store.add_events([
            _event("spot", T0, "lifecycle", "start"),
            _event("spot", T0, "cost", "price", **PRICE),
            _event("spot", T0 + 10, "checkpoint", "saved"),
            _event("spot", T0 + 16, "checkpoint", "record_lost", attempt_s=16.0),
            _event("spot", T0 + 30, "lifecycle", "start"),
            _event("spot", T0 + 31, "checkpoint", "record_imported"),
            _event("spot", T0 + 32, "cost", "price", **PRICE),
            _event("spot", T0 + 60, "checkpoint", "saved"),
            _event("spot", T0 + 69, "lifecycle", "end", status="completed"),
            _event("spot", T0 + 69, "cost", "meter", attempt_s=39.0, **PRICE)])
        total, _ = bill(store)
    finally:
        store.close()
    assert total.attempts == 2
    assert total.wasted_crash_usd == pytest.approx(6.0)  # 16 s - 10 s, at $1 a second
    assert total.hours * 3600 == pytest.approx(16.0 + 39.0)


def test_since_keeps_only_newer_runs(store: Store) -> None:
    total, _ = bill(store, since=T0 + 2 * 86400 - 1)
    assert total.run_ids == ["budget"]
    assert since_timestamp("2d", now=100 * 86400.0) == 98 * 86400.0
    assert since_timestamp("2026-12-01") == 1796083200.0
    with pytest.raises(ConfigError, match="--since 'last week' is invalid"):
        since_timestamp("last week")
