"""A nanoGPT-style script (scripts/nanogpt.py: no epochs, no DataLoader, 2 micro-steps, a
hand-set cosine learning rate, an evaluation every N iterations) under profile and tune."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest

from tests.e2e.conftest import Project, script

NANOGPT = script("nanogpt.py")
# enqueued so that the order is known: the best first, then three the pruner should stop
LRS = (1e-2, 1e-4, 3e-5, 3e-3)


def test_prudent_profile_of_a_nanogpt_run_exits_0_and_speaks_in_steps(project: Project) -> None:
    (project.path / "prudent.yaml").write_text("profile: {interval_s: 0.05}\n")
    ran = project.prudent("run", "--run-id", "gpt", "--set", "max_iters=60", "--", sys.executable,
                          NANOGPT)
    assert ran.returncode == 0, ran.stderr
    assert "prudent | gpt | step 20: val_loss=" in ran.stderr and "epoch" not in ran.stderr
    shown = project.prudent("profile", "gpt")
    assert shown.returncode == 0, shown.stderr
    assert "profile: 60 steps" in shown.stdout and "recent throughput: " in shown.stdout
    assert "samples/s" not in shown.stdout and "epoch" not in shown.stdout
    document = json.loads(project.prudent("profile", "gpt", "--json").stdout)
    assert document["profile"]["throughput"]["samples_per_s"] is None


def _intermediate(project: Project, name: str) -> dict[int, dict[int, float]]:
    from prudent.tune.study import load, open_storage, storage_url

    study = load(name, open_storage(storage_url(project.path / ".prudent", name)))
    return {t.number: dict(t.intermediate_values) for t in study.get_trials()}


@pytest.mark.slow
def test_a_tuned_nanogpt_reports_every_evaluation_at_its_step_and_the_pruner_prunes(
        project: Project) -> None:
    (project.path / "space.yaml").write_text(
        "lr: {type: float, low: 1.0e-5, high: 3.0e-2, log: true}\n")
    (project.path / "prudent.yaml").write_text("checkpoint: {every: 1000steps}\n")
    flags = [arg for lr in LRS for arg in ("--enqueue", json.dumps({"lr": lr}))]
    started = time.monotonic()
    result = project.prudent(
        "tune", "--space", "space.yaml", "--objective", "val_loss", "--direction", "min",
        "--study", "gpt", "--trials", "4", "--pruner", "asha", "--min-resource", "40",
        "--set", "max_iters=300", "--set", "eval_interval=20", "--max-steps", "100", *flags,
        "--", sys.executable, NANOGPT, timeout=240)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "each trial runs with OMP_NUM_THREADS=" in result.stderr
    summary: dict[str, Any] = json.loads(project.prudent("study", "gpt", "--json").stdout)
    trials = {t["number"]: t for t in summary["trials"]}
    values = _intermediate(project, "gpt")
    print(f"tune: {seconds:.1f} s;", {n: (t["state"], t["steps"], round(t["duration_s"], 1),
                                          sorted(values[n])) for n, t in trials.items()})
    assert summary["unit"] == "step" and "steps used" in result.stdout
    for number, reported in values.items():  # every evaluation, at its iteration
        assert len(reported) >= 3 and set(reported) <= set(range(0, 101, 20)), (number, reported)
    states = [trials[n]["state"] for n in range(4)]
    assert states[0] == "complete" and trials[0]["steps"] == 100  # the step budget: complete
    assert sorted(values[0]) == [0, 20, 40, 60, 80]
    assert trials[0]["value"] == values[0][80] == summary["best_value"]
    assert states.count("pruned") >= 1
    for t in trials.values():
        assert t["pruned_by"] in (None, "pruner") and t["params"]["lr"] in LRS
        run = project.show(t["run_id"])
        assert run["config"]["max_iters"] == 300 and run["config"]["eval_interval"] == 20
