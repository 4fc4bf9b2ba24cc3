"""The worker's decisions on a real journal study and a real store (no trial processes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from prudent.tune.study import create_or_load, open_storage, storage_url
from prudent.tune.worker import TuneJob, Worker
from prudent.wiring.config import ProjectSettings

SPACE = {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}
META = {"objective": "val_acc", "direction": "max", "space": SPACE,
        "pruner": {"name": "none", "args": {}}}


def _worker(settings: ProjectSettings, **job: object) -> tuple[Worker, optuna.Study]:
    home = str(Path(settings.store.home).resolve())
    url = storage_url(home, "w")
    study = create_or_load("w", open_storage(url), META)
    spec = {"study": "w", "storage": url, "home": home, "command": ["python", "train.py"],
            "objective": "val_acc", "sampler": "random", "pruner": {"name": "none", "args": {}}}
    return Worker(TuneJob(**{**spec, **job})), study  # type: ignore[arg-type]


def test_a_new_trial_gets_a_run_id_and_its_worker_recorded(settings: ProjectSettings) -> None:
    worker, study = _worker(settings, trials=2)
    task = worker._ask()
    assert task is not None and task.number == 0 and 0.001 <= task.params["lr"] <= 0.1
    attrs = study.trials[0].user_attrs
    assert attrs["run_id"] == task.run_id and task.run_id.startswith("w-")
    assert attrs["worker"]["pid"] > 0 and attrs["worker"]["host"] == socket.gethostname()
    worker.store.close()


def test_no_trial_starts_past_the_count_or_the_timeout(settings: ProjectSettings,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    worker, _ = _worker(settings, trials=1)
    assert worker._ask() is not None and worker._ask() is None  # the one trial is running
    worker.store.close()
    late, _ = _worker(settings, trials=5, deadline=time.time() - 1)
    assert late._ask() is None
    assert "timeout reached: no new trial starts" in capsys.readouterr().err
    late.store.close()


def test_no_trial_starts_when_the_budget_is_spent(settings: ProjectSettings,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    worker, study = _worker(settings, trials=5, budget_usd=1.0)
    task = worker._ask()
    assert task is not None
    worker.storage.set_trial_user_attr(task.trial_id, "cost_usd", 0.7)
    study.tell(task.number, 0.5)
    assert worker._ask() is None  # 0.7 spent + ~0.7 for one more > 1.0
    assert "would pass --budget-usd 1.00" in capsys.readouterr().err
    worker.store.close()


def test_a_trial_whose_worker_died_is_claimed_and_keeps_its_number(
        settings: ProjectSettings) -> None:
    worker, study = _worker(settings, trials=5)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial = study.ask()
    trial.set_user_attr("run_id", "w-abc-t0000")
    trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": dead.pid,
                                   "created": 1.0})
    alive = study.ask()  # held by a live worker (this process): left alone
    alive.set_user_attr("run_id", "w-abc-t0001")
    alive.set_user_attr("worker", worker.me)
    task = worker._claim_orphan()
    assert task is not None and task.resumed and (task.number, task.run_id) == (0, "w-abc-t0000")
    assert study.trials[0].user_attrs["worker"]["pid"] == worker.me["pid"]
    assert worker._claim_orphan() is None  # claimed now, and trial 1 is alive
    worker.store.close()


def test_a_trial_gets_the_fixed_values_its_params_its_step_budget_and_its_threads(
        settings: ProjectSettings, tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    names = ("OMP_NUM_THREADS", "PRUDENT_SET", "PRUDENT_TUNE_TRIAL")
    child = (f"import json, os; open({str(out)!r}, 'w').write(json.dumps("
             f"{{k: os.environ.get(k) for k in {names!r}}}))")
    worker, _ = _worker(settings, trials=1, command=[sys.executable, "-c", child],
                        fixed={"max_iters": 120}, max_steps=90, threads=1)
    task = worker._ask()
    assert task is not None and worker._launch(task) == 0
    seen = json.loads(out.read_text())
    assert seen["OMP_NUM_THREADS"] == "1"
    assert json.loads(seen["PRUDENT_SET"]) == {"max_iters": 120, "lr": task.params["lr"]}
    assert json.loads(seen["PRUDENT_TUNE_TRIAL"])["max_steps"] == 90
    worker.store.close()


def _ended(worker: Worker, run_id: str, *, step: int, stop_reason: str | None,
           values: dict[int, float]) -> dict[str, object]:
    store = worker.store
    store.create_run(run_id, "trial", status="stopped" if stop_reason else "completed",
                     stop_reason=stop_reason, step=step, epoch=0, ended_at=time.time())
    store.add_metrics([{"run_id": run_id, "step": s, "name": "val_acc", "value": v, "wall": 0.0}
                       for s, v in values.items()])
    return store.get_run(run_id) or {}


def test_a_trial_stopped_by_its_step_budget_is_complete_with_its_last_objective(
        settings: ProjectSettings) -> None:
    worker, study = _worker(settings, trials=2, max_steps=90)
    task = worker._ask()
    assert task is not None
    _ended(worker, task.run_id, step=90, stop_reason="budget", values={0: 0.1, 40: 0.6, 80: 0.7})
    assert worker._settle(task, 4)
    trial = study.trials[task.number]
    assert trial.state.name == "COMPLETE" and trial.value == 0.7
    assert trial.user_attrs["steps"] == 90 and trial.user_attrs["step_budget"] == 90
    worker.store.close()


def test_a_cost_budget_stop_before_the_step_budget_is_not_a_complete_trial(
        settings: ProjectSettings) -> None:
    worker, study = _worker(settings, trials=2, max_steps=90)
    task = worker._ask()
    assert task is not None
    _ended(worker, task.run_id, step=30, stop_reason="budget", values={0: 0.1})
    worker._settle(task, 4)
    assert study.trials[task.number].state.name == "FAIL"
    worker.store.close()


def test_a_trial_whose_values_the_script_never_read_fails_instead_of_being_scored(
        settings: ProjectSettings) -> None:
    """Judged at the run's end (a loop without epochs or a plan) the run completed, with an
    objective; its config/unread event still fails the trial, naming the key."""
    worker, study = _worker(settings, trials=2)
    task = worker._ask()
    assert task is not None
    _ended(worker, task.run_id, step=50, stop_reason=None, values={50: 0.9})
    message = "lr=0.01 was not read from run.config by the end of the run (trial 0 ...)"
    worker.store.add_events([{"run_id": task.run_id, "step": 50, "kind": "config",
                              "name": "unread", "message": message,
                              "payload": json.dumps({"keys": ["lr"]}), "wall": time.time()}])
    assert worker._settle(task, 0)
    trial = study.trials[task.number]
    assert trial.state.name == "FAIL" and trial.user_attrs["error"] == message
    worker.store.close()
