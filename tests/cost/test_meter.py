"""CostMeter on a fake clock: dollars, spot, nodes, attempts, budgets and policy limits."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import prudent
from prudent.cost import CostMeter
from prudent.store.database import Store
from prudent.testing import FakeClock, make_settings

PRICEY = "cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n" \
         "test,pricey,lab,A100,1,8,64,3600,900,2026-12-01\n"  # $1 a second on demand


@pytest.fixture
def catalog_file(home: Path) -> str:
    path = home.parent / "prices.csv"
    path.write_text(PRICEY)
    return str(path)


def _run(home: Path, clock: FakeClock, **cost: Any) -> tuple[prudent.Run, CostMeter]:
    sections = cost.pop("_sections", {})
    settings = make_settings(home, cost={"stop_margin": "0s", "detect": "off", **cost}, **sections)
    meter = CostMeter(settings.cost, quiet=True, clock=clock)
    run = prudent.init(name="meter", settings=settings, components=[meter], exit_on_stop=False)
    return run, meter


def _train(run: prudent.Run, clock: FakeClock, steps: int = 100, step_s: float = 1.0) -> None:
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(range(steps)):
                clock.advance(step_s)
                run.step(loss=1.0)


def _stored(home: Path, run_id: str) -> dict[str, Any]:
    store = Store.open(make_settings(home).store)
    record = store.get_run(run_id)
    events = store.events(run_id)
    store.close()
    assert record is not None
    return {**record, "events": events}


def test_without_an_instance_the_run_is_timed_at_zero_dollars(home: Path) -> None:
    clock = FakeClock()
    run, meter = _run(home, clock)
    _train(run, clock, steps=10)
    stored = _stored(home, run.id)
    assert stored["cost_usd"] == 0.0 and meter._thread is None
    (breakdown,) = [e["payload"] for e in stored["events"] if e["name"] == "meter"]
    assert breakdown["instance"] is None and breakdown["attempt_s"] == 10.0


@pytest.mark.parametrize(("spot", "nodes", "usd"), [(False, 1, 10.0), (True, 1, 2.5), (False, 3, 30.0)])
def test_dollars_are_time_times_price_times_nodes_spot_aware(
        home: Path, catalog_file: str, spot: bool, nodes: int, usd: float) -> None:
    clock = FakeClock()
    run, _ = _run(home, clock, instance="test:pricey", catalog_file=catalog_file, spot=spot,
                  nodes=nodes)
    _train(run, clock, steps=10)
    stored = _stored(home, run.id)
    assert stored["cost_usd"] == pytest.approx(usd)
    (breakdown,) = [e["payload"] for e in stored["events"] if e["name"] == "meter"]
    assert breakdown["total_usd"] == pytest.approx(usd)
    assert breakdown["saved_usd"] == pytest.approx(7.5 if spot else 0.0)
    assert (breakdown["steps_done"], breakdown["planned_steps"]) == (10, 10)  # the bill projects from these


def test_budget_stops_before_the_next_step_would_pass_it_and_says_the_numbers(
        home: Path, catalog_file: str) -> None:
    clock = FakeClock()
    run, _ = _run(home, clock, instance="test:pricey", catalog_file=catalog_file, budget_usd="$20")
    _train(run, clock)
    assert (run.status, run.stop_reason) == ("stopped", "budget")
    assert run.state.step == 18  # at step 18 ($18) a further 2 steps would reach $20
    stored = _stored(home, run.id)
    assert stored["cost_usd"] == pytest.approx(18.0)
    (limit,) = [e for e in stored["events"] if e["name"] == "limit"]
    assert limit["message"].startswith("budget_usd $20.00 reached: spent $18.00 in 18.0 s over "
                                       "1 attempt at $3600.00/h")
    assert f"--run-id {run.id}" in limit["message"]


def test_a_rerun_of_the_same_run_id_adds_to_what_earlier_attempts_cost(
        home: Path, catalog_file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "again")
    clock = FakeClock()
    run, _ = _run(home, clock, instance="test:pricey", catalog_file=catalog_file, budget_usd=10)
    _train(run, clock)
    assert run.stop_reason == "budget" and _stored(home, "again")["cost_usd"] == pytest.approx(8.0)
    run, meter = _run(home, clock, instance="test:pricey", catalog_file=catalog_file, budget_usd=25)
    _train(run, clock)
    assert meter.prior_usd == pytest.approx(8.0) and meter.prior_s == pytest.approx(8.0)
    assert meter.attempts == 2
    assert run.stop_reason == "budget" and _stored(home, "again")["cost_usd"] == pytest.approx(23.0)
    run, _ = _run(home, clock, instance="test:pricey", catalog_file=catalog_file, budget_usd=23)
    _train(run, clock)  # the budget was not raised: no step is paid for
    assert (run.stop_reason, run.state.step) == ("budget", 0)


def test_max_hours_counts_earlier_attempts_too(home: Path, catalog_file: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "hours")
    clock = FakeClock()
    for max_hours, expected_step in (("1.5min", 88), ("2min", 30)):  # 2 steps of margin
        run, _ = _run(home, clock, max_hours=max_hours)
        _train(run, clock)
        assert run.stop_reason == "budget" and run.state.step == expected_step


def test_policy_money_limit_stops_the_run_with_reason_policy(home: Path, catalog_file: str) -> None:
    clock = FakeClock()
    run, _ = _run(home, clock, instance="test:pricey", catalog_file=catalog_file,
                  _sections={"policy": {"max_usd_per_job": 5}})
    _train(run, clock)
    assert (run.stop_reason, run.exit_code) == ("policy", 6)
    (limit,) = [e for e in _stored(home, run.id)["events"] if e["name"] == "limit"]
    assert limit["message"].startswith("policy max_usd_per_job $5.00 reached: spent $3.00")


def test_a_job_the_policy_forbids_stops_at_once_when_not_launched_by_prudent_run(
        home: Path, catalog_file: str) -> None:
    clock = FakeClock()
    run, _ = _run(home, clock, instance="test:pricey", catalog_file=catalog_file,
                  _sections={"policy": {"require_spot": True}})
    _train(run, clock)
    assert (run.stop_reason, run.state.step) == ("policy", 0)


def test_stored_cost_is_updated_while_the_run_goes(home: Path, catalog_file: str) -> None:
    clock = FakeClock()
    run, _ = _run(home, clock, instance="test:pricey", catalog_file=catalog_file,
                  update_interval_s=0.02)
    with run:
        clock.advance(42.0)
        deadline = time.monotonic() + 5
        while _stored(home, run.id)["cost_usd"] < 42 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _stored(home, run.id)["cost_usd"] == pytest.approx(42.0)
        assert run.context.gauges["cost_usd"] == pytest.approx(42.0)  # what the console line shows


def test_the_training_thread_pays_one_clock_read_per_step(home: Path, catalog_file: str) -> None:
    reads = []
    clock = FakeClock()

    def counting() -> float:
        reads.append(1)
        return clock()

    settings = make_settings(home, cost={"instance": "test:pricey", "catalog_file": catalog_file,
                                         "budget_usd": 1000, "update_interval_s": 60})
    meter = CostMeter(settings.cost, quiet=True, clock=counting)
    run = prudent.init(name="hot", settings=settings, components=[meter], exit_on_stop=False)
    with run:
        before = len(reads)
        for _ in range(100):
            run.step()
        assert len(reads) - before == 100


def test_every_run_gets_a_meter_by_default(home: Path) -> None:
    from prudent.wiring.components import default_components

    meters = [c for c in default_components(make_settings(home)) if isinstance(c, CostMeter)]
    assert len(meters) == 1 and meters[0].settings.instance is None


def _imported_from_another_machine(home: Path, run_id: str, usd: float, seconds: float) -> None:
    """The run's record as a machine that vanished left it: a heartbeat, no segment."""
    from prudent.checkpoint.storage import open_storage
    from prudent.record import merge_into, read_record
    from prudent.record.format import FOLDER, Attempt, encode_heartbeat, heartbeat_file

    storage = open_storage(str(home.parent / "bucket"))
    lost = Attempt("gone", "other-host", 1, 1000.0, 1000.0 + seconds, 40, 3600.0, usd, usd)
    storage.put(FOLDER, heartbeat_file("gone"), encode_heartbeat(run_id, lost))
    store = Store.open(make_settings(home).store)
    store.create_run(run_id, "meter")
    record = read_record(storage, run_id)
    assert record is not None
    merge_into(store, run_id, record, current="here")
    store.close()


def test_budget_and_max_hours_count_the_spend_of_an_imported_machine(
        home: Path, catalog_file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "moved")
    _imported_from_another_machine(home, "moved", usd=40.0, seconds=40.0)
    clock = FakeClock()
    run, meter = _run(home, clock, instance="test:pricey", catalog_file=catalog_file,
                      budget_usd=50, max_hours="1h")
    _train(run, clock)
    assert (meter.prior_usd, meter.prior_s, meter.attempts) == (40.0, 40.0, 2)
    assert run.stop_reason == "budget" and run.state.step == 8  # $10 left, 2 steps of margin
    (breakdown,) = [e["payload"] for e in _stored(home, "moved")["events"] if e["name"] == "meter"]
    assert [a["host"] for a in breakdown["by_attempt"]][0] == "other-host"
    assert breakdown["by_attempt"][0]["usd"] == 40.0 and breakdown["total_usd"] == pytest.approx(48.0)
