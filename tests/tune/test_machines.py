"""One study, several machines, on a real PostgreSQL server: heartbeats, retries of a lost
machine's trial, the lock that keeps the count, the budget over every machine's trials."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from prudent.testing import make_settings
from prudent.tune.machines import (
    MachinesLock,
    TrialHeartbeat,
    chain_costs,
    counted,
    fail_stale,
    quiet,
    retry_of,
    superseded,
)
from prudent.tune.study import create_or_load, open_storage
from prudent.tune.worker import TuneJob, Worker

SPACE = {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}
META = {"objective": "val_acc", "direction": "max", "space": SPACE,
        "pruner": {"name": "none", "args": {}}}
SRC = Path(__file__).parents[2] / "src" / "prudent"


_OPENED: list[Any] = []


@pytest.fixture(autouse=True)
def _dispose() -> Any:
    """Every storage a test opened closes its connections (psycopg warns otherwise)."""
    yield
    while _OPENED:
        _OPENED.pop().engine.dispose()


def _study(url: str, heartbeat_s: int | None = 1) -> tuple[Any, optuna.Study]:
    storage = open_storage(url, heartbeat_s)
    _OPENED.append(storage)
    return storage, create_or_load("m", storage, META)


def _ask(study: optuna.Study) -> optuna.Trial:
    with quiet():
        return study.ask()


def _worker(url: str, home: Path, host: str, monkeypatch: pytest.MonkeyPatch,
            **job: Any) -> Worker:
    """A worker of machine ``host``: its own home and store, the shared study."""
    monkeypatch.setenv("PRUDENT_HOST", host)
    settings = make_settings(home)
    spec = {"study": "m", "storage": url, "home": str(home), "command": ["python", "t.py"],
            "objective": "val_acc", "sampler": "random", "pruner": {"name": "none", "args": {}},
            "heartbeat_s": 1}
    worker = Worker(TuneJob(**{**spec, **job}))  # type: ignore[arg-type]
    _OPENED.append(worker.storage)
    worker.settings = settings
    return worker


def _close(*workers: Worker) -> None:
    for worker in workers:
        worker.machines.close()
        worker.store.close()


def test_a_trial_whose_machine_stops_beating_is_failed_and_retried_with_its_run(
        pg_url: str) -> None:
    storage, study = _study(pg_url)
    trial = _ask(study)
    trial.suggest_float("lr", 0.001, 0.1, log=True)
    trial.set_user_attr("run_id", "m-abc-t0000")
    trial.report(0.4, step=1)
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("m"), trial.number)
    storage.record_heartbeat(trial_id)  # its machine beat once, then vanished
    fail_stale(study)
    assert study.trials[0].state.name == "RUNNING"  # not silent for 3 heartbeats yet
    time.sleep(3.5)
    fail_stale(study)
    lost, retry = study.get_trials()
    assert lost.state.name == "FAIL" and retry.state.name == "WAITING"
    assert retry_of(retry) == 0 and retry.params == lost.params
    assert retry.user_attrs["run_id"] == "m-abc-t0000" and retry.intermediate_values == {1: 0.4}
    assert superseded(study.get_trials()) == {0: 1}
    assert counted(study.get_trials()) == []  # the lost one waits in its retry


def test_a_trial_that_beats_is_left_running_and_publishes_its_spend(pg_url: str) -> None:
    storage, study = _study(pg_url)
    _ask(study)
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("m"), 0)
    spend = iter(range(100))
    with TrialHeartbeat(storage, trial_id, lambda: float(next(spend))):
        time.sleep(4.5)
        fail_stale(study)
    (trial,) = study.get_trials()
    assert trial.state.name == "RUNNING" and trial.user_attrs["spent_usd"] >= 3


def test_the_lock_excludes_other_machines_and_dies_with_its_machine(pg_url: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom prudent.tune.machines import MachinesLock\n"
         f"lock = MachinesLock({pg_url!r}, 'm')\nwith lock.held():\n"
         "    print('held', flush=True)\n    time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    lock, got = MachinesLock(pg_url, "m"), threading.Event()

    def take() -> None:
        with lock.held():
            got.set()

    taker = threading.Thread(target=take)
    taker.start()
    assert not got.wait(1.5)  # the other machine holds it
    holder.kill()  # the machine vanishes: the server ends its session and its lock
    holder.communicate()
    assert got.wait(30)
    taker.join()
    lock.close()


def test_workers_of_two_machines_racing_never_start_more_than_trials(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _study(pg_url)
    # a heartbeat long enough that no picked trial (nobody beats for it here) goes stale
    workers = [_worker(pg_url, tmp_path / f"m{i}", f"machine-{i}", monkeypatch, trials=3,
                       heartbeat_s=60) for i in range(6)]
    tasks: list[Any] = []
    start = threading.Barrier(len(workers))

    def pick(worker: Worker) -> None:
        from prudent.tune.study import study_lock

        start.wait()
        for _ in range(2):
            with study_lock(worker.job.home, "m"), worker.machines.held():
                tasks.append(worker._pick())

    threads = [threading.Thread(target=pick, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _close(*workers)
    started = [t for t in tasks if t is not None]
    assert sorted(t.number for t in started) == [0, 1, 2]  # 12 picks, 3 trials, none twice


def test_the_budget_counts_the_spend_of_another_machines_running_trial(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage, study = _study(pg_url)
    b = _worker(pg_url, tmp_path / "b", "b", monkeypatch, trials=10, budget_usd=10.0)
    done = b._ask()
    assert done is not None
    storage.set_trial_user_attr(done.trial_id, "cost_usd", 3.0)
    study.tell(done.number, 0.5)
    running = b._ask()  # b's own store has no record of it: its heartbeat published $2
    assert running is not None
    storage.set_trial_user_attr(running.trial_id, "spent_usd", 2.0)
    a = _worker(pg_url, tmp_path / "a", "a", monkeypatch, trials=10, budget_usd=10.0)
    assert a._why_not_another() == ""  # $3 + $2 + $1 left of the running one + $3 = $9
    storage.set_trial_user_attr(running.trial_id, "spent_usd", 4.5)
    why = a._why_not_another()  # $3 + $4.5 + $3 = $10.50
    assert "$7.50 spent" in why and "would pass --budget-usd 10.00" in why
    _close(a, b)


def test_a_retry_chain_is_one_run_in_the_count_and_the_cost(pg_url: str) -> None:
    storage, study = _study(pg_url, heartbeat_s=None)
    for number, (state, attrs) in enumerate([
            ("FAIL", {"run_id": "r0", "spent_usd": 4.0, "carries_spend": True}),
            ("COMPLETE", {"run_id": "r1", "cost_usd": 2.0, "carries_spend": True}),
            ("COMPLETE", {"run_id": "r0", "cost_usd": 9.0, "carries_spend": True})]):
        system = {"failed_trial": 0, "retry_history": [0]} if number == 2 else {}
        study.add_trial(optuna.create_trial(
            state=getattr(optuna.trial.TrialState, state), value=None if state == "FAIL" else 0.5,
            user_attrs=attrs, system_attrs=system))
    trials = study.get_trials()
    assert [t.number for t in counted(trials)] == [1, 2]

    def cost(t: Any) -> float:
        return float(t.user_attrs.get("cost_usd", t.user_attrs.get("spent_usd", 0.0)))

    assert sorted(chain_costs(trials, cost)) == [(2.0, True), (9.0, True)]  # r0 carried a's $4
    fresh = [optuna.trial.create_trial(state=t.state, value=t.value, system_attrs=t.system_attrs,
                                       user_attrs={**t.user_attrs, "carries_spend": False})
             for t in trials]
    for i, t in enumerate(fresh):
        t.number = i
    assert sorted(chain_costs(fresh, cost)) == [(2.0, True), (13.0, True)]  # restarted: a sum


def test_each_trial_checkpoints_in_its_own_place_under_checkpoint_url(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _study(pg_url)
    worker = _worker(pg_url, tmp_path / "a", "a", monkeypatch)
    worker.settings.checkpoint.url = "s3://bucket/tune/"
    assert worker._checkpoint_url("m-1-t0003") == "s3://bucket/tune/m-1-t0003"
    worker.settings.checkpoint.url = "s3://bucket/{run_id}/ckpt"
    assert worker._checkpoint_url("m-1-t0003") == "s3://bucket/m-1-t0003/ckpt"
    worker.settings.checkpoint.url = None
    assert worker._checkpoint_url("m-1-t0003") is None  # the run's own folder, as ever
    _close(worker)


def test_prudent_uses_no_private_optuna_api() -> None:
    private = re.compile(r"\._storage\b|\._trial_id\b|_cached_frozen_trial|\._study_id\b")
    found = [f"{path.relative_to(SRC)}:{n}" for path in SRC.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert not found, found


@pytest.mark.parametrize(("value", "message"), [
    ("0s", "--heartbeat must be > 0, got '0s': e.g. --heartbeat 60s"),
    ("soon", "duration 'soon' is invalid"),
])
def test_a_bad_heartbeat_is_refused_before_anything_runs(tmp_path: Path, value: str,
                                                         message: str) -> None:
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.01, high: 0.1}\n")
    result = subprocess.run(
        [sys.executable, "-m", "prudent", "tune", "--space", "space.yaml", "--objective", "acc",
         "--heartbeat", value, "--", sys.executable, "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / ".prudent").exists()


def test_machines_that_open_a_new_study_database_at_once_all_get_it(pg_url: str) -> None:
    """Optuna creates its tables on first open: two machines starting a study together raced
    there (PostgreSQL: duplicate key "alembic_version"), and one of them crashed."""
    code = ("import sys; from prudent.tune.machines import open_rdb; "
            "open_rdb(sys.argv[1], None); print('opened')")
    openers = [subprocess.Popen([sys.executable, "-c", code, pg_url], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [opener.communicate(timeout=120) for opener in openers]
    assert [r[0].strip() for r in results] == ["opened"] * 4, [r[1][-800:] for r in results]
