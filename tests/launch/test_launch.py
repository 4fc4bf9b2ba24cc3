from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prudent.kernel.errors import ConfigError
from prudent.launch import spec as launch
from prudent.launch.spawn import SignalForwarder, child_environ, spawn
from prudent.launch.spec import (
    ENV_OVERRIDES,
    ENV_RUN_ID,
    LaunchSpec,
    PreflightSpec,
    ReplaySpec,
    TrialSpec,
    setting_var,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "prudent"

FULL = LaunchSpec(
    run_id="r1", name="digits", overrides={"lr": 0.01, "model.hidden": 64}, supervised=True,
    smoke=True, config_path="/p/prudent.yaml",
    settings={("store", "home"): "/p/.prudent", ("cost", "instance"): "aws:g5.xlarge"},
    trial=TrialSpec("s.journal", "st", 3, 2, "val_acc", {"name": "asha", "args": {}}),
    replay=ReplaySpec(bundle="/b/step-7", step=None, pdb=True),
    preflight=PreflightSpec(mode="overfit", steps=5, stop_at=7, out="/o.json", overfit_steps=9,
                            scan_s=1.5),
    tune_job={"study": "st", "workers": 2}, tune_worker=1)


def test_a_spec_survives_the_trip_through_the_environment() -> None:
    assert LaunchSpec.from_env(FULL.to_env()) == FULL


def test_an_unset_field_writes_nothing_and_reads_back_empty() -> None:
    assert LaunchSpec().to_env() == {}
    spec = LaunchSpec.from_env({})
    assert spec == LaunchSpec(overrides={})
    assert (spec.run_id, spec.name, spec.overrides, spec.supervised, spec.smoke) == (
        None, None, {}, False, False)


def test_settings_travel_under_their_config_variable() -> None:
    env = LaunchSpec(settings={("store", "home"): "/h", ("cost", "spot"): None}).to_env()
    assert env == {setting_var("store", "home"): "/h"}
    with pytest.raises(KeyError, match="store.nothing"):
        setting_var("store", "nothing")


def test_flags_read_as_the_kernel_always_read_them() -> None:
    assert LaunchSpec.from_env({"PRUDENT_SMOKE": "0"}).smoke is False
    assert LaunchSpec.from_env({"PRUDENT_SMOKE": "yes"}).smoke is True
    assert LaunchSpec.from_env({"PRUDENT_SUPERVISED": "0"}).supervised is True  # set at all
    assert LaunchSpec.from_env({ENV_RUN_ID: ""}).run_id is None


@pytest.mark.parametrize(("raw", "message"), [
    ("{not json", r"^PRUDENT_SET is not JSON \(.*\): it is set by prudent run$"),
    ("[1]", r"^PRUDENT_SET must be a JSON object, got '\[1\]'$"),
])
def test_bad_overrides_are_config_errors(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LaunchSpec.from_env({ENV_OVERRIDES: raw})


def test_a_mangled_trial_or_number_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="PRUDENT_TUNE_TRIAL"):
        LaunchSpec.from_env({"PRUDENT_TUNE_TRIAL": "{}"})
    with pytest.raises(ConfigError, match="PRUDENT_REPLAY_STEP must be a number, got 'x'"):
        LaunchSpec.from_env({"PRUDENT_REPLAY_STEP": "x"})


def test_the_child_environment_is_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_NAME", "inherited")
    monkeypatch.setenv("KEEP_ME", "1")
    before = dict(os.environ)
    env = child_environ(LaunchSpec(run_id="r2"), extra={"EXTRA": "x"}, drop=["KEEP_ME"])
    assert os.environ == before
    assert (env[ENV_RUN_ID], env["PRUDENT_RUN_NAME"], env["EXTRA"]) == ("r2", "inherited", "x")
    assert "KEEP_ME" not in env


def test_spawning_leaves_the_parent_environment_untouched() -> None:
    before = dict(os.environ)
    child = spawn([sys.executable, "-c", "import os; print(os.environ['PRUDENT_RUN_ID'])"],
                  LaunchSpec(run_id="spawned", overrides={"a": 1}), stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=60)
    assert out.decode().strip() == "spawned"
    assert os.environ == before


_COUNTER = """
import signal, sys, time
seen = []
def note(signum, frame):
    seen.append(signum)
    print(signal.Signals(signum).name, flush=True)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(sig, note)
print("ready", flush=True)
while len(seen) < 5:
    time.sleep(0.01)
"""


def test_signals_reach_a_real_child_and_the_third_kills_it() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    with SignalForwarder(kill_message="killing") as forwarder:
        child = forwarder.add(spawn([sys.executable, "-c", _COUNTER], LaunchSpec(),
                                    stdout=subprocess.PIPE))
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        os.kill(os.getpid(), signal.SIGTERM)  # through the installed handler
        assert child.stdout.readline().strip() == b"SIGTERM"
        os.kill(os.getpid(), signal.SIGUSR1)  # SLURM's warning: passed on, not fatal here
        assert child.stdout.readline().strip() == b"SIGUSR1"
        forwarder.forward(signal.SIGINT)
        assert child.wait(timeout=30) == -signal.SIGKILL
    child.stdout.close()
    assert forwarder.signals_seen == 3
    assert signal.getsignal(signal.SIGTERM) == previous  # the handlers are put back


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_its_parent() -> None:
    parent_code = ("import sys, time\nfrom prudent.launch.spec import LaunchSpec\n"
                   "from prudent.launch.spawn import spawn\n"
                   "sleeper = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
                   "print(spawn(sleeper, LaunchSpec()).pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=30)
    parent.stdout.close()
    deadline = time.monotonic() + 30
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_only_the_launch_spec_and_config_name_prudent_variables() -> None:
    """Every PRUDENT_* name in code lives in launch/spec.py or wiring/config.py (docstrings
    aside)."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).as_posix() in ("launch/spec.py", "wiring/config.py"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr)}
        found += [f"{path.relative_to(SRC)}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and n.value.startswith("PRUDENT_") and id(n) not in docstrings]
    assert not found, f"PRUDENT_* variable spelled outside launch/spec.py: {found}"


def test_tune_job_and_trial_are_json() -> None:
    env = FULL.to_env()
    assert json.loads(env["PRUDENT_TUNE_TRIAL"])["trial_id"] == 3
    assert json.loads(env["PRUDENT_TUNE_JOB"]) == {"study": "st", "workers": 2}


def test_config_reads_the_variables_the_spec_writes() -> None:
    from prudent.wiring.config import ENV_SETTINGS, load_settings

    assert ENV_SETTINGS == launch.ENV_SETTINGS
    env = LaunchSpec(settings={("store", "home"): "/h", ("cost", "instance"): "aws:g5.xlarge",
                               ("profile", "enabled"): "0"}).to_env()
    settings = load_settings(environ=env)
    assert (settings.store.home, settings.cost.instance, settings.profile.enabled) == (
        "/h", "aws:g5.xlarge", False)
