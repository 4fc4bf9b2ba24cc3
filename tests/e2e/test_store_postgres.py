"""A run store shared by machines: PostgreSQL, with real servers, processes and outages.

A "machine" here is a project folder with its own PRUDENT_HOME; all of them point
PRUDENT_STORE_URL at one database on the session's server (tests/postgres.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prudent.store.database import Store
from tests.e2e.conftest import Project, script
from tests.postgres import PostgresServer

pytestmark = pytest.mark.timeout(180)


def _with_password(url: str) -> str:
    """The server trusts loopback, so any password works: one that must never be shown."""
    return url.replace("prudent@", "prudent:hunter2@")


def _machine(root: Path, name: str, url: str) -> Project:
    path = root / name
    path.mkdir()
    machine = Project(path)
    machine.env.update(PRUDENT_HOME=str(path / ".prudent"), PRUDENT_STORE_URL=url)
    return machine


def _start(machine: Project, run_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", run_id, "--", sys.executable, *args],
        cwd=machine.path, env=machine.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _finish(process: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


@pytest.mark.slow
def test_two_machines_writing_one_run_and_two_others_at_once_lose_no_rows(
        tmp_path: Path, pg_url: str) -> None:
    steps = 3000
    a, b = _machine(tmp_path, "a", pg_url), _machine(tmp_path, "b", pg_url)
    started = [_start(machine, run_id, script("log_many.py"), str(steps))
               for machine, run_id in [(a, "shared"), (b, "shared"), (a, "only-a"), (b, "only-b")]]
    for process in started:
        code, _, err = _finish(process)
        assert code == 0, err
    store = Store(pg_url)
    shared = store.get_run("shared")
    assert shared is not None and (shared["status"], shared["restarts"]) == ("completed", 1)
    assert [store.count_metrics(r, "value") for r in ("shared", "only-a", "only-b")] == \
        [2 * steps, steps, steps]
    assert store.count_metrics(name="value") == 4 * steps  # 12,000 rows by 4 processes, 0 lost
    for run_id, attempts in [("shared", 2), ("only-a", 1), ("only-b", 1)]:
        names = [(e["kind"], e["name"]) for e in store.events(run_id)]
        assert names.count(("lifecycle", "start")) == attempts, names
        assert names.count(("lifecycle", "end")) == attempts, names
    store.close()


def test_commands_on_any_machine_read_the_shared_store_and_never_show_its_password(
        tmp_path: Path, pg_url: str) -> None:
    url = _with_password(pg_url)
    a, b = _machine(tmp_path, "a", url), _machine(tmp_path, "b", url)
    code, out, err = _finish(_start(a, "from-a", script("log_many.py"), "20"))
    assert code == 0, err
    seen = out + err
    listed = b.prudent("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ["from-a"]
    shown = b.prudent("show", "from-a", "--json")
    assert json.loads(shown.stdout)["metrics"] == {"value": 19.0}
    for command in (["show", "from-a"], ["profile", "from-a"], ["cost"], ["show", "nosuch"]):
        result = b.prudent(*command)
        assert result.returncode == (2 if "nosuch" in command else 0), (command, result.stderr)
        seen += result.stdout + result.stderr
    assert "hunter2" not in seen + shown.stdout + listed.stdout
    assert "prudent:***@" in seen  # the error for "nosuch" names the store


@pytest.mark.slow
def test_prudent_study_reads_trial_runs_from_the_shared_store(tmp_path: Path, pg_url: str) -> None:
    pytest.importorskip("optuna")
    url = _with_password(pg_url)
    a, b = _machine(tmp_path, "a", url), _machine(tmp_path, "b", url)
    code, _, err = _finish(_start(a, "trial-0", script("log_many.py"), "5"))
    assert code == 0, err
    made = a.python("-c", f"""import optuna
study = optuna.create_study(study_name="s", storage={url!r})
study.add_trial(optuna.trial.create_trial(
    params={{"lr": 0.1}}, distributions={{"lr": optuna.distributions.FloatDistribution(0.01, 1)}},
    value=0.5, user_attrs={{"run_id": "trial-0"}}))""")
    assert made.returncode == 0, made.stderr
    result = b.prudent("study", "s", "--json", "--storage", url)
    assert result.returncode == 0, result.stderr
    (trial,) = json.loads(result.stdout)["trials"]
    assert (trial["run_id"], trial["value"]) == ("trial-0", 0.5)
    assert trial["steps"] == 5  # from the run's record in the shared store
    assert "hunter2" not in result.stdout + result.stderr


def test_unreachable_database_at_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://alice:hunter2@127.0.0.1:{port}/runs"
    machine = _machine(tmp_path, "a", url)
    marker = tmp_path / "trained"
    train = f"open({str(marker)!r}, 'w').write('trained')"
    result = machine.prudent("run", "--", sys.executable, "-c", train)
    assert result.returncode == 2 and not marker.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"postgresql://alice:***@127.0.0.1:{port}/runs" in lines[0]
    assert "PRUDENT_STORE_URL" in lines[0] and "hunter2" not in result.stderr + result.stdout


@pytest.mark.slow
def test_database_going_away_mid_run_does_not_stop_training(
        tmp_path: Path, postgres: PostgresServer, pg_url: str) -> None:
    """Away from step 50 until after the loop ended: training goes on, the end of the run
    waits for the store, and every row is written when it is back."""
    steps = 300
    machine = _machine(tmp_path, "a", _with_password(pg_url))
    process = _start(machine, "outage", script("store_outage_train.py"), str(steps))
    while _step(process) < 50:
        pass
    postgres.stop()
    gone = time.monotonic()
    while _step(process) < steps - 10:  # the last line the loop prints
        pass
    time.sleep(1.0)  # the loop is over; the run's end is waiting for the store
    postgres.start()
    outage_s = time.monotonic() - gone
    code, _, err = _finish(process)
    assert code == 0, err
    store = Store(pg_url)
    assert (store.get_run("outage") or {})["status"] == "completed"
    assert store.count_metrics("outage", "loss") == steps  # every row kept, written after it
    (outage,) = [e for e in store.events("outage") if (e["kind"], e["name"]) == ("store", "outage")]
    assert outage["payload"]["rows_dropped"] == 0 and outage["payload"]["seconds"] > 1.0
    store.close()
    assert "cannot write to the run store" in err and "answers again after" in err
    assert "0 dropped" in err and "hunter2" not in err
    assert outage_s > 3.0  # about 250 steps of 0.02 s trained while the store was away


def _step(process: subprocess.Popen[str]) -> int:
    line = process.stdout.readline()  # type: ignore[union-attr]
    assert line.startswith("STEP "), line
    return int(line.split()[1])
