"""Weights & Biases, offline: prudent's metrics per step, config, events and end read back from
the offline run's own ``.wandb`` file; a relaunch with the same run id, in a second process,
continues the same W&B run id with no step twice. Nothing reaches the network."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import prudent
from prudent.testing import make_settings
from prudent.tracking.base import RunInfo
from prudent.tracking.settings import WandbSettings
from tests.tracking.wandb_files import offline_runs

pytest.importorskip("wandb")
from prudent.tracking.wandb import WandbSink, wandb_run_id  # noqa: E402


def train(home: Path, steps: int) -> str:
    settings = make_settings(home, tracking={"wandb": {"project": "prudent-tests",
                                                       "mode": "offline"}},
                             checkpoint={"enabled": False})
    run = prudent.init(name="wb", config={"lr": 0.1, "model": {"hidden": 8}},
                       settings=settings, exit_on_stop=False)
    with run:
        for step in run.steps(steps):
            if step == 0:  # as `prudent report` would have written it
                (run.context.run_dir / "report.html").write_text("<html>report</html>")
            run.step(loss=float(step))
        run.log(val_acc=0.5)
    return run.context.id


def test_wandb_offline_run_has_metrics_per_step_config_events_and_summary(
        home: Path, wandb_offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "wb-one")
    train(home, steps=12)
    (found,) = offline_runs(wandb_offline)
    assert found.run_id == "wb-one"
    losses = {step: row["loss"] for step, row in found.history.items() if "loss" in row}
    assert losses == {step: float(step - 1) for step in range(1, 13)}
    assert found.history[12]["val_acc"] == 0.5
    assert found.history[12]["prudent/event/lifecycle"] == 1.0
    assert "prudent/profile/num_steps" in found.history[12]
    assert found.config["lr"] == 0.1
    assert found.config["model"] == {"hidden": 8}
    summary = found.summary
    assert (summary["prudent/status"], summary["prudent/exit_code"]) == ("completed", 0)
    assert summary["prudent/verdict"].startswith("run wb-one completed, 12 steps")
    assert summary["prudent/event/lifecycle/end"] == "completed"
    assert summary["prudent/event/profile/summary"].startswith("profile: 12 steps")
    assert "step 12: [lifecycle/end] completed" in summary["prudent/events"]
    table = summary["prudent/event_table"]
    assert table["_type"] == "table-file" and table["path"] in found.files
    assert "report.html" in found.files
    assert found.exit_code == 0


def rows(steps: range, value: float) -> list[dict[str, float]]:
    return [{"step": s, "name": "loss", "value": value + s, "wall": 1e9 + s} for s in steps]


SECOND_ATTEMPT = """
from pathlib import Path
from prudent.tracking.base import RunInfo
from prudent.tracking.settings import WandbSettings
from prudent.tracking.wandb import WandbSink

info = RunInfo(run_id="r/1", name="r", run_dir=Path({run_dir!r}))
sink = WandbSink(WandbSettings(project="p", mode="offline"), info)
sink.open()
sink.write_events([{{"step": 20, "kind": "checkpoint", "name": "resumed", "message": "from 20",
                    "payload": "{{}}", "wall": 2e9}}])
sink.write_metrics([{{"step": s, "name": "loss", "value": 100.0 + s, "wall": 2e9}}
                    for s in range(21, 41)])
sink.flush()
sink.close("completed")
print(sink.num_skipped)
"""


def test_a_relaunch_in_a_second_process_continues_the_same_wandb_run_without_a_step_twice(
        tmp_path: Path, wandb_offline: Path) -> None:
    info = RunInfo(run_id="r/1", name="r", run_dir=tmp_path / "run")
    first = WandbSink(WandbSettings(project="p", mode="offline"), info)  # killed after step
    first.open()  # 30, its last checkpoint at step 20
    first.write_config({"lr": 0.1})
    first.write_metrics(rows(range(1, 31), 0.0))
    first.flush()
    first.close("failed")
    second = subprocess.run([sys.executable, "-c", textwrap.dedent(SECOND_ATTEMPT).format(
        run_dir=str(info.run_dir))], capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["11"]  # loss at 21..30 and the marker at 20: sent before
    attempts = offline_runs(wandb_offline)
    assert [a.run_id for a in attempts] == [wandb_run_id("r/1")] * 2  # one W&B run
    steps = [step for a in attempts for step, row in a.history.items() if "loss" in row]
    assert sorted(steps) == list(range(1, 41))  # one curve: no step twice
    losses = {s: row["loss"] for a in attempts for s, row in a.history.items() if "loss" in row}
    assert losses == {s: float(s) for s in range(1, 31)} | {s: 100.0 + s for s in range(31, 41)}
    assert "step 20: [checkpoint/resumed] from 20" in attempts[1].summary["prudent/events"]
    assert attempts[1].summary["prudent/num_skipped_values"] == 11


def test_an_event_that_arrives_before_the_metrics_of_earlier_steps_loses_none_of_them(
        tmp_path: Path, wandb_offline: Path) -> None:
    """The store writer can hand over an event (a monitor's, at step 10) before the metrics of
    steps 1-9: sent at once it would move W&B's step to 10 and W&B would refuse steps 1-9."""
    sink = WandbSink(WandbSettings(project="p", mode="offline"),
                     RunInfo(run_id="early", name="e", run_dir=tmp_path / "run"))
    sink.open()
    sink.write_events([{"step": 10, "kind": "monitor", "name": "memory", "message": "m",
                        "payload": "{}", "wall": 1e9}])
    sink.flush()
    sink.write_metrics(rows(range(1, 13), 0.0))
    sink.flush()
    sink.write_events([{"step": 14, "kind": "lifecycle", "name": "end", "message": "completed",
                        "payload": "{}", "wall": 1e9}])
    sink.flush()  # past the newest metrics: held until the end
    sink.close("completed")
    (found,) = offline_runs(wandb_offline)
    assert {s: row["loss"] for s, row in found.history.items() if "loss" in row} == {
        s: float(s) for s in range(1, 13)}
    assert found.history[10]["prudent/event/monitor"] == 1.0
    assert found.history[14]["prudent/event/lifecycle"] == 1.0
    assert sink.num_skipped == 0


def test_wandb_run_id_is_the_run_id_where_wandb_takes_it_else_stable_and_clean() -> None:
    assert wandb_run_id("digits-20260101_120000") == "digits-20260101_120000"
    cleaned = wandb_run_id("team/run:1")
    assert cleaned == wandb_run_id("team/run:1") and cleaned.startswith("team-run-1-")
    assert wandb_run_id("team/run:1") != wandb_run_id("team-run-1")
    assert len(wandb_run_id("x" * 200)) <= 64


def test_wandb_configured_but_not_installed_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from prudent.kernel.errors import ConfigError

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"pip install 'prudent\[wandb\]'"):
        WandbSink(WandbSettings(project="p"), RunInfo("r", "r", tmp_path))


def test_a_wandb_run_the_script_started_gets_prudents_rows_and_the_script_finishes_it(
        home: Path, wandb_offline: Path) -> None:
    """No `tracking:` settings: the W&B run the script started before prudent.init gets
    prudent's metrics (at `prudent/step`), config, events and verdict, no second W&B run is
    made, and the run is still the script's to log to and to finish."""
    import wandb

    mine = wandb.init(project="mine", config={"lr": 0.5})
    run = prudent.init(name="wb-own", config={"lr": 0.1, "batch": 4}, settings=make_settings(
        home, checkpoint={"enabled": False}), exit_on_stop=False)
    with run:
        for step in run.steps(6):
            run.step(loss=float(step))
            mine.log({"mine/acc": step / 10})  # the script's own rows, at W&B's own step
    assert wandb.run is mine  # prudent left it open
    mine.log({"mine/after": 1.0})
    mine.finish()
    (found,) = offline_runs(wandb_offline)
    assert found.run_id == mine.id
    losses = {row["prudent/step"]: row["loss"] for row in found.history.values() if "loss" in row}
    assert losses == {step: float(step - 1) for step in range(1, 7)}
    assert sum("mine/acc" in row for row in found.history.values()) == 6
    assert any("mine/after" in row for row in found.history.values())
    assert found.config["lr"] == 0.5 and found.config["batch"] == 4  # the script's value stays
    summary = found.summary
    assert summary["prudent/verdict"].startswith(f"run {run.context.id} completed, 6 steps")
    assert summary["prudent/event/lifecycle/end"] == "completed"
    assert "step 6: [lifecycle/end] completed" in summary["prudent/events"]
    assert found.exit_code == 0  # the script's finish, the only one
