"""A run with TensorBoard and MLflow configured, preempted (SIGTERM, exit 75) mid-run and
resumed with the same run id: each tracker shows one continuous curve, no step twice, and
MLflow one run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import Project, script
from tests.mlflow_server import MLFLOW_ENV, mlflow_server  # noqa: F401 - the session's server

STEPS = 60


@pytest.mark.slow
def test_preempted_and_resumed_run_is_one_curve_in_tensorboard_and_mlflow(
        project: Project, mlflow_server: str) -> None:  # noqa: F811
    pytest.importorskip("tensorboard")
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    project.env.update(MLFLOW_ENV)
    (project.path / "prudent.yaml").write_text(
        f"tracking: {{tensorboard: {{logdir: tb}}, mlflow: {{tracking_uri: '{mlflow_server}', "
        "experiment: e2e}}\n")
    command = ["run", "--run-id", "tracked", "--", sys.executable, script("tracking_train.py")]
    first = subprocess.Popen([sys.executable, "-m", "prudent", *command], cwd=project.path,
                             env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    assert first.stdout is not None and first.stdout.readline().strip() == "READY"
    time.sleep(0.6)  # ~20 of the 60 steps
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 75, err
    stopped_at = project.show("tracked")["step"]
    assert 1 <= stopped_at < STEPS

    resumed = project.prudent(*command, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert project.show("tracked")["status"] == "completed"

    board = EventAccumulator(str(project.path / "tb" / "tracked"),
                             size_guidance={"scalars": 0, "tensors": 0})
    board.Reload()
    its = board.Scalars("it")
    assert [s.step for s in its] == list(range(1, STEPS + 1))  # one curve, no step twice
    assert [s.value for s in its] == [float(s - 1) for s in range(1, STEPS + 1)]
    events = [e.tensor_proto.string_val[0].decode()
              for e in board.Tensors("prudent/events/text_summary")]
    assert any(text.startswith("[checkpoint/resumed]") for text in events)
    assert any("[lifecycle/stop_requested]" in text for text in events)

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("e2e")
    (found,) = client.search_runs([experiment.experiment_id])  # one MLflow run for both
    history = client.get_metric_history(found.info.run_id, "it")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))
    assert found.info.status == "FINISHED" and found.data.tags["prudent.status"] == "completed"
    assert found.data.tags["prudent.run_id"] == "tracked"
