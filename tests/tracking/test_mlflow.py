"""MLflow: a real tracking server (``mlflow server``, SQLite backend, loopback) read back with
MlflowClient: metrics per step, params, tags, the report artifact; a relaunch with the same
run id continues the same MLflow run, found by its tag on a machine that never saw it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import prudent
from prudent.testing import make_settings

pytestmark = pytest.mark.slow  # the session's mlflow server takes ~20 s to start


def train(home: Path, url: str, steps: int, first: int = 0, report: bool = False) -> Any:
    settings = make_settings(home, tracking={"mlflow": {"tracking_uri": url,
                                                        "experiment": "prudent-tests"}},
                             checkpoint={"enabled": False})
    run = prudent.init(name="mlf", config={"lr": 0.1, "model": {"hidden": 8}},
                       settings=settings, exit_on_stop=False)
    with run:
        for step in run.steps(steps):
            if report and step == 0:
                (run.context.run_dir / "report.html").write_text("<html>report</html>")
            run.step(loss=float(first + step))
        run.log(val_acc=0.5)
    return run


def client_runs(url: str, run_id: str) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("prudent-tests")
    return client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`prudent.run_id` = '{run_id}'")


def test_mlflow_gets_metrics_params_tags_and_the_report(home: Path, mlflow_server: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("PRUDENT_RUN_ID", "mlf-one")
    train(home, mlflow_server, steps=15, report=True)
    (found,) = client_runs(mlflow_server, "mlf-one")
    client = MlflowClient(mlflow_server)
    history = client.get_metric_history(found.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, float(s - 1)) for s in range(1, 16)]
    assert found.data.metrics["val_acc"] == 0.5
    assert found.data.params == {"lr": "0.1", "model.hidden": "8"}
    tags = found.data.tags
    assert (tags["prudent.status"], tags["prudent.exit_code"]) == ("completed", "0")
    assert tags["prudent.verdict"].startswith("run mlf-one completed, 15 steps")
    assert tags["prudent.event.lifecycle.end"] == "completed"
    assert tags["prudent.event.profile.summary"].startswith("profile: 15 steps")
    assert "prudent.profile.num_steps" in found.data.metrics
    assert found.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id, "prudent")}
    assert "prudent/report.html" in artifacts
    assert any(p.startswith("prudent/events-") for p in artifacts)


def test_a_relaunch_continues_the_same_mlflow_run_even_on_a_new_machine(
        home: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("PRUDENT_RUN_ID", "mlf-two")
    train(home, mlflow_server, steps=5)
    kept = home / "runs" / "mlf-two" / "tracking.json"
    first_id = client_runs(mlflow_server, "mlf-two")[0].info.run_id
    assert first_id in kept.read_text()
    kept.unlink()  # a new machine: no run folder, the MLflow run is found by its tag
    train(home, mlflow_server, steps=5, first=100)
    (found,) = client_runs(mlflow_server, "mlf-two")
    assert found.info.run_id == first_id
    history = MlflowClient(mlflow_server).get_metric_history(first_id, "loss")
    assert sorted(m.value for m in history) == [0.0, 1.0, 2.0, 3.0, 4.0, 100.0, 101.0, 102.0,
                                                103.0, 104.0]


def test_an_mlflow_run_the_script_started_gets_prudents_rows_and_the_script_ends_it(
        home: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `tracking:` settings: the MLflow run the script started before prudent.init gets
    prudent's metrics and end (tagged with prudent's run id); the script ends that run."""
    import mlflow
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # put back after the test
    mlflow.set_tracking_uri(mlflow_server)
    client = MlflowClient(mlflow_server)
    with mlflow.start_run(run_name="mine") as active:
        mlflow.log_param("optimizer", "sgd")
        run = prudent.init(name="mlf-own", settings=make_settings(
            home, checkpoint={"enabled": False}), exit_on_stop=False)
        with run:
            for step in run.steps(6):
                run.step(loss=float(step))
        mine = active.info.run_id
        assert client.get_run(mine).info.status == "RUNNING"  # prudent left it open
    found = client.get_run(mine)
    assert found.info.status == "FINISHED"  # ended by the script's `with`
    assert [m.step for m in client.get_metric_history(mine, "loss")] == list(range(1, 7))
    assert found.data.tags["prudent.run_id"] == run.context.id
    assert found.data.tags["prudent.status"] == "completed"
    assert found.data.params == {"optimizer": "sgd"}  # prudent's config was empty
