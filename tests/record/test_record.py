"""The run's record travels with its checkpoints: export, import on a new machine, heartbeat,
refusals, idempotence. In process, on a local folder (S3 is covered by tests/e2e)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import prudent
from prudent.checkpoint.manager import Checkpointer
from prudent.checkpoint.storage import open_storage
from prudent.checkpoint.writer import CheckpointWriter
from prudent.cost import CostMeter
from prudent.kernel.errors import ConfigError
from prudent.kernel.events import Component
from prudent.record import RecordSync, merge_into, read_record
from prudent.record.format import (
    FOLDER,
    Attempt,
    Segment,
    encode_heartbeat,
    encode_segment,
    heartbeat_file,
    segment_file,
)
from prudent.store.database import Store
from prudent.store.recorder import MetricsRecorder
from prudent.testing import make_settings, tiny_model

PRICEY = ("cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n"
          "test,pricey,lab,A100,1,8,64,3600,1800,2026-12-01\n")  # $1 a second on demand


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``machine("a", steps)``: train on a machine with its own home, checkpoints shared."""
    (tmp_path / "prices.csv").write_text(PRICEY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRUDENT_RUN_ID", "spot1")
    monkeypatch.setenv("PRUDENT_CONSOLE", "off")
    shared = str(tmp_path / "bucket")

    def train(name: str, steps: int, heartbeat: str = "off", sleep_s: float = 0.0,
              extra: tuple[Any, ...] = (), mode: str = "sync") -> Store:
        monkeypatch.setenv("PRUDENT_HOST", f"host-{name}")
        settings = make_settings(
            tmp_path / name, checkpoint={"url": shared, "every": "3steps", "mode": mode,
                                         "heartbeat_interval": heartbeat},
            cost={"instance": "test:pricey", "catalog_file": str(tmp_path / "prices.csv"),
                  "detect": "off", "stop_margin": "0s"})
        components = [MetricsRecorder(every_s=0.5), RecordSync(settings.checkpoint),
                      CostMeter(settings.cost, quiet=True), Checkpointer(settings.checkpoint), *extra]
        run = prudent.init(name="spot", settings=settings, components=components,
                           exit_on_stop=False)
        run.attach(model=tiny_model())
        with run:
            for it in run.steps(steps):
                run.step(loss=1.0 / (it + 1))
                time.sleep(sleep_s)
        return Store.open(settings.store)

    return train


def test_a_new_machine_continues_the_history_restarts_and_spend(machine: Any) -> None:
    first = machine("a", steps=7)
    spent_a = first.get_run("spot1")["cost_usd"]
    first.close()
    second = machine("b", steps=10)
    run = second.get_run("spot1")
    assert run["restarts"] == 1
    losses = second.metric_series("spot1", "loss")
    # a's 7 steps, then b's from a's last checkpoint (step 6): the whole history
    assert [step for step, _ in losses] == [*range(1, 8), *range(7, 11)]
    events = second.events("spot1")
    prices = [e["payload"] for e in events if (e["kind"], e["name"]) == ("cost", "price")]
    assert [p["host"] for p in prices] == ["host-a", "host-b"]
    assert prices[0]["attempt"] != prices[1]["attempt"]
    assert any(e["name"] == "record_imported" for e in events)
    meter = [e["payload"] for e in events if e["name"] == "meter"][-1]
    assert [a["host"] for a in meter["by_attempt"]] == ["host-a", "host-b"]
    assert meter["prior_usd"] == pytest.approx(spent_a, rel=0.05, abs=0.05)
    assert run["cost_usd"] == pytest.approx(spent_a + meter["attempt_usd"], abs=0.05)
    second.close()


def test_importing_twice_adds_nothing(machine: Any, tmp_path: Path) -> None:
    machine("a", steps=4).close()
    store = machine("b", steps=4)
    before = (len(store.events("spot1")), store.count_metrics("spot1"), store.get_run("spot1"))
    record = read_record(open_storage(str(tmp_path / "bucket")), "spot1")
    assert record is not None
    result = merge_into(store, "spot1", record, current="none")
    assert (result.num_events, result.num_metrics, result.foreign) == (0, 0, [])
    after = (len(store.events("spot1")), store.count_metrics("spot1"), store.get_run("spot1"))
    assert after[:2] == before[:2]
    assert {k: v for k, v in after[2].items() if before[2][k] != v} == {}
    store.close()


def test_the_same_machine_restarting_duplicates_no_rows(machine: Any) -> None:
    machine("a", steps=4).close()
    store = machine("a", steps=7)
    steps = [step for step, _ in store.metric_series("spot1", "loss")]
    assert steps == [1, 2, 3, 4, 4, 5, 6, 7] and store.get_run("spot1")["restarts"] == 1
    store.close()


def test_heartbeat_is_written_while_training(machine: Any, tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    storage = open_storage(str(tmp_path / "bucket"))

    class Peek(Component):
        def on_step_end(self, ctx: Any, metrics: dict[str, Any]) -> None:
            for name in storage.files(FOLDER):
                if name.startswith("heartbeat-"):
                    seen.append(json.loads(storage.read(FOLDER, name) or b"{}")["attempt"])

    machine("a", steps=6, heartbeat="0.05s", sleep_s=0.1, extra=(Peek(),)).close()
    beats = [json.loads(storage.read(FOLDER, n) or b"") for n in storage.files(FOLDER)
             if n.startswith("heartbeat-")]
    (beat,) = beats
    attempt = beat["attempt"]
    assert beat["run_id"] == "spot1" and attempt["host"] == "host-a"
    assert attempt["status"] == "completed" and attempt["step"] == 6
    assert attempt["hourly_usd"] == 3600.0 and attempt["total_usd"] >= 0.6 * 3600 / 3600
    # while training: a fresh beat every step or so, with the spend so far and no status yet
    assert len({beat["last_seen"] for beat in seen}) >= 4
    assert all(beat["status"] is None for beat in seen)
    assert seen[-1]["last_seen"] > seen[0]["last_seen"] and seen[-1]["attempt_usd"] > 0


def test_a_checkpoint_commits_only_once_the_bucket_holds_its_steps_rows(
        machine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine may vanish right after a checkpoint commits, before the record's thread
    wakes: the thread never runs here, and the bucket must still hold every loss row of the
    checkpoint's steps (and the 'saved' event of the checkpoint before it)."""
    monkeypatch.setattr(RecordSync, "_loop", lambda self, run: None)
    storage = open_storage(str(tmp_path / "bucket"))
    seen: dict[int, tuple[list[int], list[int]]] = {}

    class Peek(Component):
        def on_checkpoint_saved(self, ctx: Any, path: str) -> None:
            record = read_record(storage, "spot1")
            assert record is not None
            rows = [r for s in record.segments for r in s.metrics if r[1] == "loss"]
            saved = [r[0] for s in record.segments for r in s.events if r[2] == "saved"]
            seen[ctx.state.step] = (sorted(r[0] for r in rows), saved)

    machine("a", steps=7, extra=(Peek(),)).close()
    assert seen[3] == ([1, 2, 3], [])
    assert seen[6] == ([1, 2, 3, 4, 5, 6], [3])


def test_saves_that_chain_commit_each_after_the_saved_event_of_the_one_before(
        machine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Background saves written slower than the steps between them: each new save waits for
    the one in flight, and the writer is never idle at a step's end. The one before must
    still be recorded as 'saved' in the bucket before the new one commits."""
    monkeypatch.setattr(RecordSync, "_loop", lambda self, run: None)
    storage = open_storage(str(tmp_path / "bucket"))
    at_commit: dict[int, list[int]] = {}
    write_manifest = CheckpointWriter._write_manifest

    def slow_then_peek(self: CheckpointWriter, handle: Any, step: int, *args: Any) -> None:
        time.sleep(0.15)  # longer than the 3 steps of 0.02 s to the next save
        record = read_record(storage, "spot1")
        assert record is not None
        at_commit[step] = sorted(r[0] for s in record.segments for r in s.events
                                 if r[2] == "saved")
        write_manifest(self, handle, step, *args)

    monkeypatch.setattr(CheckpointWriter, "_write_manifest", slow_then_peek)
    store = machine("a", steps=13, sleep_s=0.02, mode="async")
    saved = [e["step"] for e in store.events("spot1") if e["name"] == "saved"]
    store.close()
    assert saved == [3, 6, 9, 12]
    assert at_commit == {3: [], 6: [3], 9: [3, 6], 12: [3, 6, 9]}


def _segment(run_id: str, attempt: Attempt, events: list[list[Any]] | None = None) -> bytes:
    return encode_segment(Segment(run_id, attempt, 0, {"started_at": attempt.started_at},
                                  events or [], [[1, "loss", 0.5, attempt.started_at + 1]]))


def _store(tmp_path: Path) -> Store:
    store = Store.open(make_settings(tmp_path / "home").store)
    store.create_run("spot1", "spot")
    return store


def test_a_lost_machine_is_billed_to_its_last_heartbeat(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "bucket"))
    lost = Attempt("a1", "host-a", 1, 1000.0, 1010.0, 5, 3600.0, 10.0, 10.0)
    storage.put(FOLDER, segment_file("a1", 0), _segment("spot1", lost))
    storage.put(FOLDER, heartbeat_file("a1"), encode_heartbeat(
        "spot1", Attempt("a1", "host-a", 1, 1000.0, 1040.0, 9, 3600.0, 40.0, 40.0)))
    store = _store(tmp_path)
    record = read_record(storage, "spot1")
    assert record is not None
    result = merge_into(store, "spot1", record, current="b1")
    assert [a.id for a in result.lost] == ["a1"] and result.total_usd == 40.0
    run = store.get_run("spot1")
    assert (run["restarts"], run["cost_usd"]) == (1, 40.0)
    names = [(e["kind"], e["name"]) for e in store.events("spot1")]
    assert names == [("cost", "price"), ("checkpoint", "record_lost")]  # the price recovered
    (gap,) = [e for e in store.events("spot1") if e["name"] == "record_lost"]
    assert gap["wall"] == 1040.0 and "could not be recovered" in gap["message"]
    assert "billed $40.00 up to its last heartbeat" in gap["message"]
    store.close()


def test_an_attempt_that_ended_cleanly_elsewhere_is_not_billed_as_a_crash(machine: Any) -> None:
    from prudent.cost.bill import run_line

    machine("a", steps=7).close()  # completed on host-a: its end came after its last segment
    store = machine("b", steps=10)
    events = store.events("spot1")
    ends = [e for e in events if (e["kind"], e["name"]) == ("lifecycle", "end")]
    assert [e["payload"]["status"] for e in ends] == ["completed", "completed"]
    assert ends[0]["payload"]["host"] == "host-a" and ends[0]["payload"]["recovered"]
    line = run_line(store.get_run("spot1"), events)
    assert line.attempts == 2 and line.wasted_crash_usd == 0.0
    store.close()


def test_back_on_the_first_machine_each_attempt_has_one_end(machine: Any) -> None:
    machine("a", steps=4).close()
    machine("b", steps=7).close()  # recovers a's end from its heartbeat, and sends it on
    store = machine("a", steps=9)
    ends = [e["payload"] for e in store.events("spot1") if e["name"] == "end"]
    assert len(ends) == 3, ends
    assert [bool(e.get("recovered")) for e in ends].count(True) == 1  # b's, from b's beat
    assert store.get_run("spot1")["restarts"] == 2
    store.close()


def test_a_third_machine_adds_the_recovered_rows_of_a_lost_attempt_once(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "bucket"))
    storage.put(FOLDER, heartbeat_file("a1"), encode_heartbeat(
        "spot1", Attempt("a1", "host-a", 1, 1000.0, 1040.0, 9, 3600.0, 40.0, 40.0)))
    second = _store(tmp_path / "b")
    record = read_record(storage, "spot1")
    assert record is not None
    merge_into(second, "spot1", record, current="b1")
    rows = [[e["step"], e["kind"], e["name"], e["message"], json.dumps(e["payload"]), e["wall"]]
            for e in second.events("spot1")]  # what b's first segment carries on
    b1 = Attempt("b1", "host-b", 2, 1100.0, 1110.0, 9, 3600.0, 10.0, 50.0, "completed")
    price = [0, "cost", "price", "b1", json.dumps({"attempt": "b1", "host": "host-b"}), 1100.0]
    storage.put(FOLDER, segment_file("b1", 0), _segment("spot1", b1, [*rows, price]))
    third = _store(tmp_path / "c")
    record = read_record(storage, "spot1")
    assert record is not None
    merge_into(third, "spot1", record, current="c1")
    names = [(e["kind"], e["name"]) for e in third.events("spot1")]
    assert names.count(("checkpoint", "record_lost")) == 1, names
    assert names.count(("cost", "price")) == 2, names  # a1's recovered once, and b1's
    second.close()
    third.close()


def test_runs_sharing_a_run_id_template_in_checkpoint_url_each_keep_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRUDENT_CONSOLE", "off")
    settings = make_settings(tmp_path / "home", checkpoint={
        "url": str(tmp_path / "bucket" / "{run_id}"), "every": "3steps", "mode": "sync"})

    def train(run_id: str, steps: int) -> None:
        monkeypatch.setenv("PRUDENT_RUN_ID", run_id)
        components = [MetricsRecorder(every_s=0.5), RecordSync(settings.checkpoint),
                      CostMeter(settings.cost, quiet=True), Checkpointer(settings.checkpoint)]
        run = prudent.init(name=run_id, settings=settings, components=components,
                           exit_on_stop=False)
        run.attach(model=tiny_model())
        with run:
            for it in run.steps(steps):
                run.step(loss=1.0 / (it + 1))

    train("r1", 4)
    train("r2", 5)  # one URL for both runs: refused (exit 2) before {run_id}
    train("r1", 7)  # continues its own checkpoint and record, not r2's
    assert sorted(p.name for p in (tmp_path / "bucket").iterdir()) == ["r1", "r2"]
    store = Store.open(settings.store)
    steps = [step for step, _ in store.metric_series("r1", "loss")]
    assert steps == [1, 2, 3, 4, 4, 5, 6, 7] and store.get_run("r1")["restarts"] == 1
    assert [step for step, _ in store.metric_series("r2", "loss")] == [1, 2, 3, 4, 5]
    store.close()
    for run_id in ("r1", "r2"):
        record = read_record(open_storage(str(tmp_path / "bucket" / run_id)), run_id)
        assert record is not None and record.run_id == run_id


def test_imported_events_are_listed_in_time_order_with_the_local_ones(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "bucket"))
    earlier = Attempt("a1", "host-a", 1, 1000.0, 1010.0, 5, 3600.0, 10.0, 10.0, "completed")
    rows = [[0, "cost", "price", "a1", json.dumps({"attempt": "a1"}), 1000.0],
            [5, "checkpoint", "saved", "", "{}", 1009.0]]
    storage.put(FOLDER, segment_file("a1", 0), _segment("spot1", earlier, rows))
    store = _store(tmp_path)
    # this attempt's start reached the store before the import (the writer flushed first)
    store.add_events([{"run_id": "spot1", "step": 0, "kind": "lifecycle", "name": "start",
                       "message": "", "payload": "{}", "wall": 2000.0}])
    record = read_record(storage, "spot1")
    assert record is not None
    merge_into(store, "spot1", record, current="b1")
    walls = [e["wall"] for e in store.events("spot1")]
    assert walls == sorted(walls) and walls[-1] == 2000.0, walls
    store.close()


def test_a_record_of_another_run_is_refused_and_nothing_merged(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "bucket"))
    storage.put(FOLDER, segment_file("x1", 0), _segment("other", Attempt("x1", "h", 1, 1.0, 2.0)))
    with pytest.raises(ConfigError, match="belongs to run 'other', not 'spot1': it was not merged"):
        read_record(storage, "spot1")


@pytest.mark.parametrize("damage", [lambda data: data[: len(data) // 2],
                                    lambda data: data[:20] + bytes([data[20] ^ 0xFF]) + data[21:],
                                    lambda data: b"not a record"])
def test_a_damaged_record_is_refused_and_nothing_merged(tmp_path: Path, damage: Any) -> None:
    storage = open_storage(str(tmp_path / "bucket"))
    good = Attempt("a1", "h", 1, 1.0, 2.0)
    storage.put(FOLDER, segment_file("a1", 0), _segment("spot1", good))
    storage.put(FOLDER, segment_file("a1", 1), damage(_segment("spot1", good)))
    with pytest.raises(ConfigError, match=r"seg-a1-000001.json.gz is unreadable .*none of the "
                                          "record was merged"):
        read_record(storage, "spot1")


def test_a_refused_record_stops_the_run_before_training(machine: Any, tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "bucket"))
    storage.put(FOLDER, segment_file("x1", 0), _segment("other", Attempt("x1", "h", 1, 1.0, 2.0)))
    with pytest.raises(ConfigError, match="belongs to run 'other'"):
        machine("a", steps=3)
