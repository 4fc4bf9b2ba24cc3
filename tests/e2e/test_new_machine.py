"""A spot VM vanishes and the same command starts on a new machine with an empty disk: the
model, the record, the spend and the budget come back from the checkpoint bucket.

Two "machines" are two project folders (two homes) sharing one ``s3://`` checkpoint URL on a
real S3-compatible server (moto's) on loopback; the first machine's whole process tree is
frozen (SIGSTOP: no last word) and then killed.
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
from tests.e2e.test_resume import assert_identical, final_state

HEARTBEAT_S = 0.5
PRICEY = ("cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n"
          "test,pricey,lab,A100,1,8,64,3600,1800,2026-12-01\n")  # $1 a second on demand


def _machine(root: Path, name: str, url: str, endpoint: str) -> Project:
    path = root / name
    path.mkdir()
    project = Project(path)
    project.env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": endpoint,
                        "PRUDENT_HOST": name, "PRUDENT_CONSOLE": "off"})
    (path / "prices.csv").write_text(PRICEY)
    (path / "prudent.yaml").write_text(
        f"checkpoint: {{url: '{url}', every: 5steps, heartbeat_interval: {HEARTBEAT_S}s}}\n"
        "cost: {catalog_file: prices.csv, stop_margin: 0s, update_interval_s: 0.2, detect: 'off'}\n")
    return project


def _start(project: Project, args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "prudent", *args], cwd=project.path,
                            env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _freeze_then_kill(supervisor: subprocess.Popen[str]) -> None:
    """The VM is gone: every process stops at once (no signal handler runs), then dies."""
    parent = psutil.Process(supervisor.pid)
    tree = [parent, *parent.children(recursive=True)]
    for process in tree:
        process.send_signal(signal.SIGSTOP)
    time.sleep(3 * HEARTBEAT_S)  # the bucket goes on without it: no heartbeat advances
    for process in reversed(tree):
        process.kill()
    supervisor.communicate(timeout=30)


def _store(project: Project) -> Store:
    return Store(f"sqlite:///{project.path / '.prudent' / 'prudent.db'}")


def _wait(check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the first machine made no progress"
        time.sleep(0.05)


def _steps_logged(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _loss_rows(store: Store) -> list[tuple[int, float, float]]:
    """(step, value, wall) of each loss row, in the order stored."""
    import sqlalchemy as sa

    from prudent.store.database import metrics

    stmt = (sa.select(metrics.c.step, metrics.c.value, metrics.c.wall)
            .where(metrics.c.run_id == "spot1", metrics.c.name == "loss").order_by(metrics.c.id))
    with store.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(stmt)]


def _saved_steps(store: Store) -> list[int]:
    if store.get_run("spot1") is None:
        return []
    return [e["step"] for e in store.events("spot1") if e["name"] == "saved"]


@pytest.mark.slow
def test_a_new_machine_continues_the_model_the_record_and_the_bill(
        tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{s3_bucket(s3_endpoint, monkeypatch)}/runs/spot1"
    train = ["--set", "sleep_s=0.1", "--set", "workers=0", "--", sys.executable,
             script("resume_train.py")]
    reference = _machine(tmp_path, "reference", f"{tmp_path}/reference-ckpts", s3_endpoint)
    done = reference.prudent("run", "--run-id", "ref", "--set", "sleep_s=0", "--set", "workers=0",
                             "--", sys.executable, script("resume_train.py"), timeout=300)
    assert done.returncode == 0, done.stderr

    command = ["run", "--run-id", "spot1", "--instance", "aws:g5.xlarge", "--spot",
               "--budget-usd", "50", *train]
    first = _machine(tmp_path, "machine-1", url, s3_endpoint)
    supervisor = _start(first, command)
    _wait(lambda: _steps_logged(first.path / "steps.log") >= 22)
    local = _store(first)
    _wait(lambda: max(_saved_steps(local), default=0) >= 20)
    _freeze_then_kill(supervisor)
    killed_at = _steps_logged(first.path / "steps.log")
    saved_locally = _saved_steps(local)
    last_saved = max(saved_locally)
    spent_first = local.get_run("spot1")["cost_usd"]
    first_losses = _loss_rows(local)
    local.close()

    second = _machine(tmp_path, "machine-2", url, s3_endpoint)
    finished = second.prudent(*command, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert_identical(final_state(reference.path / "final.pt"), final_state(second.path / "final.pt"))

    shown = second.show("spot1")
    assert shown["status"] == "completed" and shown["restarts"] >= 1
    prices = [e["payload"] for e in shown["events"] if (e["kind"], e["name"]) == ("cost", "price")]
    assert [p["host"] for p in prices] == ["machine-1", "machine-2"]
    assert len({p["attempt"] for p in prices}) == 2
    attempts = shown["cost"]["by_attempt"]
    assert [a["host"] for a in attempts] == ["machine-1", "machine-2"]
    saved_first = [e["step"] for e in shown["events"] if e["name"] == "saved"
                   and e["wall"] < shown["events"][-1]["wall"]]
    (resumed_at,) = [e["step"] for e in shown["events"] if e["name"] == "resumed"]
    assert resumed_at >= last_saved  # its newest checkpoint, whose own 'saved' may have died
    # the events before it went to the bucket before it committed: every earlier 'saved'
    assert {s for s in saved_locally if s < resumed_at} <= set(saved_first), saved_first
    (lost,) = [e for e in shown["events"] if e["name"] == "record_lost"]
    assert "could not be recovered" in lost["message"] and lost["payload"]["attempt_usd"] > 0

    # the first machine's metrics: all it had stored by its last heartbeat, first in the
    # history (the recorder hands rows to the store every 0.5 s: those may be missing)
    store = _store(second)
    losses = _loss_rows(store)
    store.close()
    last_seen = lost["payload"]["last_seen"]
    surely_sent = [row for row in first_losses if row[2] <= last_seen - 0.6]
    assert surely_sent and surely_sent[-1][0] >= last_saved - 8
    assert losses[:len(surely_sent)] == surely_sent
    # the bill: both machines, the first one up to its last heartbeat
    hourly = prices[0]["hourly_usd"]
    slack = hourly * (HEARTBEAT_S + 0.2 + 0.1) / 3600  # one heartbeat, one meter update, clocks
    expected = spent_first + attempts[-1]["usd"]
    assert shown["cost_usd"] == pytest.approx(expected, abs=slack)
    print(f"machine 1 killed at step {killed_at} (last checkpoint {last_saved}); machine 2: "
          f"restarts {shown['restarts']}, cost ${shown['cost_usd']:.6f} vs ${expected:.6f} "
          f"(tolerance ${slack:.6f})")


@pytest.mark.slow
def test_the_budget_holds_across_machines(tmp_path: Path, s3_endpoint: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{s3_bucket(s3_endpoint, monkeypatch)}/runs/spot1"
    budget = 10.0  # $1 a second on test:pricey: 10 s in all, 3 s of it on the second machine
    command = ["run", "--run-id", "spot1", "--instance", "test:pricey", "--budget-usd",
               str(budget), "--set", "sleep_s=0.05", "--set", "epochs=10", "--", sys.executable,
               script("cost_train.py")]
    first = _machine(tmp_path, "machine-1", url, s3_endpoint)
    supervisor = _start(first, command)
    _wait(lambda: (first.path / ".prudent" / "prudent.db").exists())
    local = _store(first)
    _wait(lambda: (local.get_run("spot1") or {}).get("cost_usd", 0) >= 0.7 * budget)
    _freeze_then_kill(supervisor)
    spent_first = local.get_run("spot1")["cost_usd"]
    local.close()
    assert spent_first < budget

    second = _machine(tmp_path, "machine-2", url, s3_endpoint)
    stopped = second.prudent(*command, timeout=300)
    assert stopped.returncode == 4, stopped.stderr
    shown = second.show("spot1")
    (limit,) = [e for e in shown["events"] if (e["kind"], e["name"]) == ("cost", "limit")]
    assert f"budget_usd ${budget:.2f} reached" in limit["message"]
    assert "over 2 attempts" in limit["message"]
    # stopped at the budget counting both machines (the stop's own save and exit come after);
    # the meter counts from prudent.init: on a loaded machine the setup alone may pass it
    (resumed,) = [e["step"] for e in shown["events"] if e["name"] == "resumed"]
    assert limit["payload"]["total_usd"] >= budget - 1.0  # it stops a few steps ahead
    assert limit["payload"]["total_usd"] <= budget + 0.5 or limit["step"] == resumed + 1
    assert (shown["status"], shown["stop_reason"]) == ("stopped", "budget")
    saved = [e for e in shown["events"] if e["name"] == "saved"]
    assert saved[-1]["step"] == shown["step"]  # the stop wrote a checkpoint
    assert shown["cost_usd"] >= limit["payload"]["total_usd"]
    bill = second.prudent("cost", "--json")
    assert bill.returncode == 0, bill.stderr
    (line,) = json.loads(bill.stdout)["groups"]
    assert line["attempts"] == 2 and line["spent_usd"] == pytest.approx(shown["cost_usd"], abs=1e-3)
    table = second.prudent("cost")  # what a person reads: the run's row counts both attempts
    assert table.returncode == 0, table.stderr
    (row,) = [r for r in table.stdout.splitlines() if line["key"][:8] in r]
    assert row.split("│")[3].strip() == "2", table.stdout  # run | runs | attempts
    print(f"machine 1 spent ${spent_first:.2f} of ${budget:.2f}; machine 2 stopped at "
          f"${shown['cost_usd']:.2f}, step {shown['step']}")
