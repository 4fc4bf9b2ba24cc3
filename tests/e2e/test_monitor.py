"""The failure-injection suite: real training scripts, each sick in one way or healthy, run as
real processes with prudent's default rules. Each sick one must be caught by its rule; no
healthy one may raise anything.

Scripts: ``tests/e2e/scripts/monitor_*.py``; they print ``SCENARIO planned=N onset=S``. The
scenarios of one test module run two at a time (they are mostly waiting for torch to import).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prudent.store.database import Store
from tests.e2e.conftest import SCRIPTS, Project

HANG = {"monitor": {"rules": {"stalled": {"timeout_s": 3, "grace_s": 2}}}}
NO_CHECKPOINTS = {"checkpoint": {"enabled": False}}  # saves are not what these runs test
EVERY_50 = {"checkpoint": {"every": "50steps"}}  # a rollback needs one from before the spike


@dataclass(frozen=True)
class Scenario:
    name: str
    rule: str | None  # the rule that must catch it; None: healthy
    action: str = "stop"
    supervised: bool = False  # run under `prudent run`
    settings: Any = None  # prudent.yaml, beyond the defaults
    checkpoints: bool = False
    also: tuple[str, ...] = ()  # other rules that may catch it first


@dataclass
class Outcome:
    scenario: Scenario
    project: Project
    result: subprocess.CompletedProcess[str]
    run: dict[str, Any]
    events: list[dict[str, Any]]

    @property
    def rules_fired(self) -> list[tuple[str, int]]:
        return [(e["name"], e["payload"]["detected_at"]) for e in self.events if e["kind"] == "rule"]

    @property
    def scenario_line(self) -> tuple[int, int | None]:
        match = re.search(r"SCENARIO planned=(\d+) onset=(\w+)", self.result.stdout)
        assert match, self.result.stderr[-2000:]
        onset = match.group(2)
        return int(match.group(1)), int(onset) if onset.isdigit() else None


FAST = [
    Scenario("nan_batch", "non_finite"),
    # with checkpoints on, loss_spike may roll the explosion back first; it comes back
    Scenario("high_lr", "exploding_gradient", supervised=True, checkpoints=True,
             also=("loss_spike",)),
    Scenario("hang", "stalled", supervised=True, settings=HANG),
    Scenario("spike_skip", "loss_spike", action="skip"),
    # three bad batches in a row: each update skipped, their gradient norms no explosion
    Scenario("burst_skip", "loss_spike", action="skip"),
    Scenario("healthy_noisy", None),
    Scenario("healthy_spikes", None),
]
SLOW = [
    Scenario("divergence", "divergence", also=("dead_activations",)),  # the same check
    Scenario("deep_sigmoid", "vanishing_gradient"),
    Scenario("shuffled_labels", "loss_not_decreasing"),
    Scenario("tiny_lr", "update_ratio"),
    Scenario("dead_relu", "dead_activations"),
    Scenario("leak", "memory_growth"),
    Scenario("overfit", "overfitting", also=("early_stopping",)),
    # only val_acc logged: overfitting watches it when no val_loss comes (memorised labels)
    Scenario("random_labels", "early_stopping", also=("overfitting", "loss_not_decreasing")),
    Scenario("leak_short", "memory_growth"),
    Scenario("late_nan", "non_finite", checkpoints=True),
    Scenario("lr_zero", "update_ratio"),
    Scenario("spike_rollback", "loss_spike", action="rollback", settings=EVERY_50,
             checkpoints=True),
    Scenario("healthy_mlp", None),
    Scenario("healthy_regression", None),
    Scenario("healthy_cnn", None),
    Scenario("healthy_restarts", None),
    Scenario("healthy_plateau", None),
    Scenario("healthy_clipped", None),
    Scenario("healthy_finetune", None),
    Scenario("healthy_sparse_eval", None),
    Scenario("healthy_shift", None),
    Scenario("healthy_solved", None),  # loss ~1e-5: gradients vanish because it has learnt
]


def run_scenario(scenario: Scenario, root: Path) -> Outcome:
    project = Project(root / scenario.name)
    project.path.mkdir()
    settings = {**(scenario.settings or {}), **({} if scenario.checkpoints else NO_CHECKPOINTS)}
    (project.path / "prudent.yaml").write_text(json.dumps(settings))
    script = str(SCRIPTS / f"monitor_{scenario.name}.py")
    run_id = f"mon-{scenario.name}"
    if scenario.supervised:
        result = project.prudent("run", "--run-id", run_id, "--", sys.executable, script,
                                 timeout=300)
    else:
        project.env["PRUDENT_RUN_ID"] = run_id
        result = project.python(script, timeout=300)
    database = project.path / ".prudent" / "prudent.db"
    assert database.exists(), f"{scenario.name} did not start:\n{result.stderr[-3000:]}"
    store = Store(f"sqlite:///{database}")
    try:
        return Outcome(scenario, project, result, store.get_run(run_id) or {},
                       store.events(run_id))
    finally:
        store.close()


def run_all(scenarios: list[Scenario], root: Path) -> dict[str, Outcome]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda s: run_scenario(s, root), scenarios))
    return {o.scenario.name: o for o in outcomes}


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    return run_all(FAST, tmp_path_factory.mktemp("monitor-fast"))


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    return run_all(SLOW, tmp_path_factory.mktemp("monitor-slow"))


def check_sick(outcome: Outcome) -> None:
    scenario = outcome.scenario
    if scenario.action in ("skip", "rollback"):
        return check_repaired(outcome)
    planned, onset = outcome.scenario_line
    fired = outcome.rules_fired
    assert fired, f"{scenario.name}: nothing fired\n{outcome.result.stderr[-3000:]}"
    first_rule, detected_at = fired[0]
    assert first_rule in (scenario.rule, *scenario.also), fired
    assert onset is None or detected_at >= onset  # never before the sickness began
    event = next(e for e in outcome.events if e["kind"] == "rule")
    assert f"step {event['step']}" in event["message"]
    assert f"rule {first_rule}: {event['message']}" in outcome.result.stderr
    stopped_by = outcome.run["stop_reason"].removeprefix("rule:")
    assert stopped_by in (scenario.rule, *scenario.also), outcome.run["stop_reason"]
    if outcome.run["status"] == "completed":
        # an overfitting run that early stopping ended after its progress: the training is
        # done, exit 0, and the script's code after `with run:` ran (with the best weights)
        assert (scenario.name, stopped_by) == ("overfit", "early_stopping"), outcome.run
        assert outcome.result.returncode == 0 and "COMPLETED" in outcome.result.stdout
    else:
        assert outcome.run["status"] == "stopped"
        assert outcome.result.returncode == 3 and "COMPLETED" not in outcome.result.stdout
    assert outcome.run["step"] < planned
    if stopped_by != "stalled" and outcome.run["status"] == "stopped":
        # how to go on with the rule off (a hung loop is interrupted: no stop check reached;
        # a completed run is done: nothing to go on with)
        stop = next(e for e in outcome.events if e["name"] == "stop_requested")
        assert f"monitor: {{rules: {{{stopped_by}: {{enabled: false}}}}}}" in stop["message"]
    assert not [e for e in outcome.events if e["name"] == "not_finite"] or scenario.checkpoints


def check_repaired(outcome: Outcome) -> None:
    """Skipped or rolled back, then trained to the end."""
    assert outcome.result.returncode == 0, outcome.result.stderr[-3000:]
    assert outcome.run["status"] == "completed" and "COMPLETED" in outcome.result.stdout
    planned, onset = outcome.scenario_line
    name = "skipped_update" if outcome.scenario.action == "skip" else "rollback"
    repairs = [e for e in outcome.events if e["name"] == name]
    assert repairs and all(e["step"] >= onset for e in repairs), outcome.events  # type: ignore[operator]
    assert [e for e in outcome.events if e["kind"] == "rule" and e["name"] != "loss_spike"] == []
    if name == "rollback":
        assert repairs[0]["payload"]["checkpoint_step"] < onset  # type: ignore[operator]
        assert outcome.run["step"] == planned - repairs[0]["payload"]["skip_batches"]


def check_healthy(outcome: Outcome) -> None:
    assert outcome.result.returncode == 0, outcome.result.stderr[-3000:]
    assert outcome.run["status"] == "completed"
    # no stop, no rollback: notes and repairs only
    said = {("monitor", "blind"), ("monitor", "skipped_update"), ("monitor", "outlier_trained")}
    noise = [e for e in outcome.events if e["kind"] in ("rule", "monitor", "capture_requested")
             and (e["kind"], e["name"]) not in said]
    assert noise == [], noise
    assert "rule " not in outcome.result.stderr


@pytest.mark.parametrize("name", [s.name for s in FAST if s.rule])
def test_sick_run_is_caught_by_its_rule(fast: dict[str, Outcome], name: str) -> None:
    check_sick(fast[name])


@pytest.mark.parametrize("name", [s.name for s in FAST if not s.rule])
def test_healthy_run_raises_nothing(fast: dict[str, Outcome], name: str) -> None:
    check_healthy(fast[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", [s.name for s in SLOW if s.rule])
def test_sick_run_is_caught_by_its_rule_slow(slow: dict[str, Outcome], name: str) -> None:
    check_sick(slow[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", [s.name for s in SLOW if not s.rule])
def test_healthy_run_raises_nothing_slow(slow: dict[str, Outcome], name: str) -> None:
    check_healthy(slow[name])


def test_a_rule_stop_is_checkpointed_shown_and_not_relaunched(fast: dict[str, Outcome]) -> None:
    outcome = fast["high_lr"]
    shown = outcome.project.show("mon-high_lr")
    assert (shown["status"], shown["stop_reason"], shown["restarts"]) == (
        "stopped", "rule:exploding_gradient", 0)
    names = [(e["kind"], e["name"]) for e in shown["events"]]
    assert ("supervisor", "relaunch") not in names
    rule_at = names.index(("rule", "exploding_gradient"))
    saves = [e for e in shown["events"][rule_at:] if (e["kind"], e["name"]) == ("checkpoint", "saved")]
    assert saves and saves[-1]["step"] == shown["step"]  # the stop left a checkpoint of its step
    assert Path(saves[-1]["payload"]["path"]).exists()
    if ("monitor", "rollback") in names:  # the repair was tried: the stop says it did not hold
        stop = shown["events"][rule_at]
        assert "it came back after rollback 1 to step" in stop["message"], stop["message"]


def _burst_run(tmp_path: Path, kind: str, burst: int, **extra: str) -> tuple[
        dict[str, Any], list[dict[str, Any]], list[float]]:
    """monitor_burst_skip.py with ``burst`` batches in a row x50 from the 300th batch drawn:
    the run's row, its events and its val_loss series."""
    project = Project(tmp_path / kind)
    project.path.mkdir()
    project.env.update(PRUDENT_RUN_ID=kind, MONITOR_BURST=str(burst), MONITOR_SCALE="50",
                       MONITOR_ONSET="300", **extra)
    result = project.python(str(SCRIPTS / "monitor_burst_skip.py"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    store = Store(f"sqlite:///{project.path / '.prudent' / 'prudent.db'}")
    try:
        return (store.get_run(kind), store.events(kind),
                [v for _, v in store.metric_series(kind, "val_loss")])
    finally:
        store.close()


def test_a_bad_shard_is_skipped_whole_or_rolled_back_past_never_stopped(tmp_path: Path) -> None:
    """A bad shard (batches in a row with inputs x50, from the 300th batch drawn). Ten
    batches: loss_spike skips all ten updates (repair before stop: a skipped step is not
    counted toward a spike that lasts while the skips' budget holds), nothing is rolled back,
    and the run ends as the untouched one does. Twenty: loss_spike skips ten,
    exploding_gradient four more by their norms, the rest get through and the loss stays
    up; the rollback to a checkpoint before the shard (and past its batches) repairs it, and
    the explosion its rolled-back updates showed is not acted on."""
    _, _, untouched = _burst_run(tmp_path, "untouched", 10, MONITOR_HEALTHY="1")
    run, events, val_loss = _burst_run(tmp_path, "ten", 10)
    assert run["status"] == "completed" and run["stop_reason"] is None
    skips = [e for e in events if e["name"] == "skipped_update"]
    assert [(e["step"], e["payload"]["rule"]) for e in skips] == [
        (step, "loss_spike") for step in range(300, 310)]
    assert not [e for e in events if e["name"] in ("rollback", "repaired")]
    assert abs(val_loss[-1] - untouched[-1]) / untouched[-1] < 0.01, (val_loss, untouched)

    run, events, val_loss = _burst_run(tmp_path, "twenty", 20)
    assert run["status"] == "completed" and run["stop_reason"] is None
    names = [(e["kind"], e["name"]) for e in events]
    assert sorted(e["payload"]["rule"] for e in events if e["name"] == "skipped_update") == (
        ["exploding_gradient"] * 4 + ["loss_spike"] * 10)
    assert names.count(("monitor", "rollback")) == 1
    repaired = [e for e in events if (e["kind"], e["name"]) == ("monitor", "repaired")]
    assert repaired and repaired[0]["payload"]["rule"] == "exploding_gradient"
    assert "not acted on: the rollback to step" in repaired[0]["message"]
    assert abs(val_loss[-1] - untouched[-1]) / untouched[-1] < 0.02, (val_loss, untouched)


def test_a_hung_loop_is_stopped_with_every_thread_stack_saved(fast: dict[str, Outcome]) -> None:
    outcome = fast["hang"]
    assert "HANGING" in outcome.result.stdout
    assert outcome.run["step"] == 59
    stacks = outcome.project.path / ".prudent" / "runs" / "mon-hang" / "stalled-stacks.txt"
    text = stacks.read_text()
    assert "training stalled: no step for" in text and "Thread MainThread" in text
    assert "time.sleep(3600)" in text and "in batches" in text


def test_bad_monitor_settings_stop_prudent_run_before_training(project: Project) -> None:
    (project.path / "prudent.yaml").write_text(
        "monitor:\n"
        "  rules:\n"
        "    explodng_gradient: {factor: 5}\n"
        "    loss_not_decreasing: {window: -10}\n"
        "    divergence: {min_rise: lots}\n")
    result = project.prudent("run", "--", sys.executable, str(SCRIPTS / "monitor_nan_batch.py"))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("prudent: error: ")
    for expected in (
            ("prudent.yaml: unknown key 'monitor.rules.explodng_gradient' (did you mean "
             "'monitor.rules.exploding_gradient'?); allowed: non_finite, "),
            ("prudent.yaml: monitor.rules.loss_not_decreasing.window=-10 is invalid: Input "
             "should be greater than or equal to 1"),
            ("prudent.yaml: monitor.rules.divergence.min_rise='lots' is invalid: Input should be "
             "a valid number")):
        assert expected in line
    assert not (project.path / ".prudent").exists()


UNINTERRUPTIBLE = """
import signal, time
import prudent
run = prudent.init(name="deaf")
with run:
    for step in run.batches(range(10)):
        if step == 3:
            print("DEAF", flush=True)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # a C call ignoring signals
            time.sleep(3600)
        run.step(loss=1.0)
"""


@pytest.mark.slow
def test_a_loop_deaf_to_signals_is_ended_with_exit_code_3(project: Project) -> None:
    (project.path / "prudent.yaml").write_text(json.dumps(
        {"monitor": {"rules": {"stalled": {"timeout_s": 1, "grace_s": 1}}}}))
    result = project.prudent("run", "--run-id", "deaf", "--", sys.executable, "-c",
                             UNINTERRUPTIBLE, timeout=120)
    assert result.returncode == 3 and "DEAF" in result.stdout
    shown = project.show("deaf")
    assert (shown["status"], shown["stop_reason"], shown["step"]) == ("stopped", "rule:stalled", 3)
    assert "ignored SIGUSR2" in " ".join(e["message"] for e in shown["events"])


def test_scenario_scripts_all_have_a_test() -> None:
    scripts = {p.stem.removeprefix("monitor_") for p in SCRIPTS.glob("monitor_*.py")}
    assert scripts == {s.name for s in FAST + SLOW}
    assert len([s for s in FAST + SLOW if s.rule]) >= 15
    assert len([s for s in FAST + SLOW if not s.rule]) >= 8

