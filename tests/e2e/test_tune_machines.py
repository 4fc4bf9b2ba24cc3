"""One study tuned by two machines: a real PostgreSQL study, checkpoints in a real S3 bucket,
and one machine's whole process tree frozen then killed in the middle of a trial.

A "machine" is a project folder with its own home (its own run store) and its own
``PRUDENT_HOST``; both run the same ``prudent tune --storage postgresql://...`` command with
``checkpoint.url`` in one bucket (moto's S3 server on loopback).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from prudent.store.database import Store
from tests.e2e.conftest import Project, s3_bucket, script

pytestmark = pytest.mark.timeout(600)

PRICEY = ("cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n"
          "test,pricey,lab,A100,1,8,64,3600,1800,2026-12-01\n")  # $1 a second on demand
SPACE = """
lr:            {type: float, low: 0.01, high: 0.1, log: true}
hidden:        {type: int, low: 8, high: 32}
epoch_sleep_s: {type: categorical, choices: [0.6]}
"""
STEPS = 4 * 16  # a complete trial: 4 epochs of 16 steps (tune_train.py)
HEARTBEAT_S = 1  # the trials' heartbeat: a trial silent for 3 s has lost its machine


def _machine(root: Path, name: str, bucket: str, endpoint: str) -> Project:
    path = root / name
    path.mkdir()
    machine = Project(path)
    machine.env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": endpoint,
                        "PRUDENT_HOST": name, "PRUDENT_CONSOLE": "off",
                        "PRUDENT_HOME": str(path / ".prudent")})
    (path / "prices.csv").write_text(PRICEY)
    (path / "space.yaml").write_text(SPACE)
    (path / "prudent.yaml").write_text(
        f"checkpoint: {{url: 's3://{bucket}/tune', every: 8steps, heartbeat_interval: 0.5s}}\n"
        "cost: {catalog_file: prices.csv, stop_margin: 0s, update_interval_s: 0.2, "
        "detect: 'off'}\n")
    return machine


def _tune(machine: Project, url: str, *flags: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "prudent", "tune", "--space", "space.yaml", "--objective",
               "val_acc", "--study", "m", "--storage", url, "--heartbeat", f"{HEARTBEAT_S}s",
               "--pruner", "none", "--max-epochs", "4", "--instance", "test:pricey", *flags,
               "--", sys.executable, script("tune_train.py")]
    return subprocess.Popen(command, cwd=machine.path, env=machine.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _trials(storage: Any) -> list[Any]:
    import optuna

    try:
        return optuna.load_study(study_name="m", storage=storage).get_trials()
    except KeyError:
        return []


def _mid_trial_on(url: str, host: str, timeout_s: float = 180) -> Any:
    """A running trial of ``host`` past its first epoch (and so its first checkpoint)."""
    import optuna

    storage = optuna.storages.RDBStorage(url)
    try:
        return _wait_mid_trial(storage, host, timeout_s)
    finally:
        storage.engine.dispose()


def _wait_mid_trial(storage: Any, host: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for trial in _trials(storage):
            owner = trial.user_attrs.get("worker") or {}
            if (trial.state.name == "RUNNING" and owner.get("host") == host
                    and trial.intermediate_values):
                return trial
        time.sleep(0.2)
    raise AssertionError(f"no trial of {host} reached its first epoch in time")


def _freeze_then_kill(tuner: subprocess.Popen[str]) -> None:
    """The machine is gone: every process of it stops at once, then dies (no last word)."""
    parent = psutil.Process(tuner.pid)
    tree = [parent, *parent.children(recursive=True)]
    for process in tree:
        process.send_signal(signal.SIGSTOP)
    for process in reversed(tree):
        process.send_signal(signal.SIGKILL)
    tuner.communicate(timeout=30)


def _store(machine: Project) -> Store:
    return Store(f"sqlite:///{machine.path / '.prudent' / 'prudent.db'}")


def _study(machine: Project, url: str) -> dict[str, Any]:
    shown = machine.prudent("study", "m", "--storage", url, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


@pytest.mark.slow
def test_two_machines_share_a_study_and_a_killed_machines_trial_resumes_on_the_other(
        tmp_path: Path, pg_url: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    trials = 4
    bucket = s3_bucket(s3_endpoint, monkeypatch)
    a, b = (_machine(tmp_path, name, bucket, s3_endpoint) for name in ("a", "b"))
    flags = ("--trials", str(trials), "--seed", "0", "--budget-usd", "1000")
    first = _tune(a, pg_url, *flags)
    second = _tune(b, pg_url, *flags)
    try:
        lost = _mid_trial_on(pg_url, "a")
        store_a = _store(a)
        _freeze_then_kill(first)
        spent_on_a = store_a.get_run(lost.user_attrs["run_id"])["cost_usd"]
        store_a.close()
        out, err = second.communicate(timeout=400)
    finally:
        for tuner in (first, second):
            if tuner.poll() is None:
                tuner.kill()
                tuner.communicate()
    assert second.returncode == 0, err
    summary = _study(b, pg_url)
    rows = {t["number"]: t for t in summary["trials"]}

    # the lost trial: failed by the heartbeat, its run resumed by a retry on machine b
    gone = rows[lost.number]
    assert gone["state"] == "failed" and gone["resumed_as"] is not None, gone
    retry = rows[gone["resumed_as"]]
    assert retry["retry_of"] == lost.number and retry["state"] == "complete", retry
    assert retry["run_id"] == gone["run_id"] == lost.user_attrs["run_id"]
    assert (f"trial {lost.number} lost its machine (a: no heartbeat); trial {retry['number']} "
            f"resumes its run {retry['run_id']} from its checkpoint") in err
    run = b.show(retry["run_id"])
    assert run["status"] == "completed" and run["restarts"] >= 1 and run["step"] == STEPS
    assert "resumed" in [e["name"] for e in run["events"] if e["kind"] == "checkpoint"]
    assert [x["host"] for x in run["cost"]["by_attempt"]] == ["a", "b"]

    # the count: every other trial ran once, on one machine; the lost one counts once
    assert summary["trials_counted"] == trials and summary["resumed"] == 1
    assert sorted(rows) == list(range(trials + 1))  # Optuna's numbers: one retry added
    others = [t for t in rows.values() if t["number"] not in (gone["number"], retry["number"])]
    assert all(t["state"] == "complete" and t["steps"] == STEPS for t in others), others
    assert len({t["run_id"] for t in rows.values()}) == trials
    # the bill: the study sums both machines, the resumed run once (it carries a's spend)
    store_b = _store(b)
    costs_b = {t["run_id"]: store_b.get_run(t["run_id"]) for t in rows.values()}
    store_b.close()
    assert run["cost_usd"] >= spent_on_a + run["cost"]["by_attempt"][-1]["usd"] - 0.7
    by_machine = sum(t["cost_usd"] for t in others) + run["cost_usd"]
    assert summary["cost_usd_total"] == pytest.approx(by_machine, abs=1e-6)
    ran_on_a = [t for t in others if costs_b[t["run_id"]] is None]
    print(f"lost trial {lost.number} (${spent_on_a:.2f} on a) resumed as trial "
          f"{retry['number']} on b; trials on a: {[t['number'] for t in ran_on_a]}, study "
          f"cost ${summary['cost_usd_total']:.2f}")


@pytest.mark.slow
def test_the_budget_holds_across_two_machines(
        tmp_path: Path, pg_url: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each machine checks what both spent and are spending: together they stop at the
    budget (each alone would have spent it: twice the budget)."""
    # $1 a second: a trial costs $8-30 on 2 shared cores (less on a quiet machine), so 2-10
    # trials fit and the budget, never --trials, ends the study; the first ones are estimated
    # at 4 epochs x 4 s = $16 until one has finished
    budget = 60.0
    bucket = s3_bucket(s3_endpoint, monkeypatch)
    a, b = (_machine(tmp_path, name, bucket, s3_endpoint) for name in ("a", "b"))
    flags = ("--trials", "40", "--seed", "0", "--budget-usd", str(budget), "--epoch-s", "4")
    tuners = [_tune(a, pg_url, *flags), _tune(b, pg_url, *flags)]
    try:
        ended = [tuner.communicate(timeout=400) for tuner in tuners]
    finally:
        for tuner in tuners:
            if tuner.poll() is None:
                tuner.kill()
                tuner.communicate()
    for tuner, (_, err) in zip(tuners, ended):
        assert tuner.returncode == 0, err
        assert f"would pass --budget-usd {budget:.2f}; no new trial starts" in err
    summary = _study(b, pg_url)
    hosts = {t["run_id"]: (t["state"], t["cost_usd"]) for t in summary["trials"]}
    assert 2 <= summary["trials_counted"] < 40 and len(hosts) == summary["trials_counted"]
    # every trial finished and billed; the two machines' spend together stays at the budget,
    # give or take one trial (a trial may cost more than the mean of those before it); a
    # budget each machine kept alone would have let both spend it
    assert all(state == "complete" and usd > 0 for state, usd in hosts.values()), hosts
    dearest = max(usd for _, usd in hosts.values())
    assert summary["cost_usd_total"] <= budget + dearest, summary["cost_usd_total"]
    ran = {m: sum(1 for t in summary["trials"] if _ran_on(m, t["run_id"])) for m in (a, b)}
    assert all(ran.values()), ran  # both machines ran trials
    print(f"budget ${budget:.2f}: {summary['trials_counted']} trials (dearest ${dearest:.2f}) "
          f"({', '.join(f'{m.path.name}: {n}' for m, n in ran.items())}), study cost "
          f"${summary['cost_usd_total']:.2f}")


def _ran_on(machine: Project, run_id: str) -> bool:
    store = _store(machine)
    try:
        return store.get_run(run_id) is not None
    finally:
        store.close()
