"""Continuous profiling end to end: contrived bottlenecks in real runs under `prudent run`.

Each scenario has one bottleneck made of sleeps, large enough to be unambiguous on a busy
two-core machine, and must be diagnosed by its finding and by no other. Every `prudent run`
costs two Python processes that import torch, so only three tests run by default; the rest
are marked slow (CI runs them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from prudent.cli import main
from tests.e2e.conftest import Project, script

# sample often (runs last seconds); no checkpoints but where they are the bottleneck under test
FAST_SAMPLING = "profile: {interval_s: 0.05}\n"
NO_CHECKPOINTS = FAST_SAMPLING + "checkpoint: {enabled: false}\n"


def run_scenario(project: Project, run_id: str, scenario: str, *extra: str,
                 settings: str = NO_CHECKPOINTS, exit_code: int = 0) -> tuple[dict[str, Any], str]:
    """`prudent run` one scenario; returns its profile.json and the console output."""
    (project.path / "prudent.yaml").write_text(settings)
    result = project.prudent("run", "--run-id", run_id, "--set", f"scenario={scenario}", *extra,
                             "--", sys.executable, script("profile_bottlenecks.py"))
    assert result.returncode == exit_code, result.stderr
    profile = json.loads((project.path / ".prudent" / "runs" / run_id / "profile.json").read_text())
    return profile, result.stderr


def finding_ids(profile: dict[str, Any]) -> list[str]:
    return [f["id"] for f in profile["findings"]]


def test_slow_dataset_is_input_bound_and_prudent_profile_says_to_add_workers(
        project: Project, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    profile, stderr = run_scenario(project, "slow-data", "input_bound", "--profile-steps", "5:8")
    assert finding_ids(profile) == ["input_bound"]
    (finding,) = profile["findings"]
    assert finding["evidence"]["data_pct"] > 50  # 20 ms of data to ~10 ms of compute
    assert profile["breakdown"]["data"]["pct"] > profile["breakdown"]["compute"]["pct"]
    assert profile["throughput"]["batch_size"] == 4
    assert "prudent | slow-data | profile: 40 steps" in stderr and "findings: input_bound" in stderr
    run_dir = project.path / ".prudent" / "runs" / "slow-data"
    assert json.loads((run_dir / "trace-steps-5-8.pt.trace.json").read_text())["traceEvents"]
    assert "aten::" in (run_dir / "ops-steps-5-8.txt").read_text()
    # what `prudent profile slow-data` prints (in this process: one torch import less)
    monkeypatch.chdir(project.path)
    monkeypatch.setattr(sys, "argv", ["prudent", "profile", "slow-data"])
    for var in ("PRUDENT_HOME", "PRUDENT_CONFIG", "PRUDENT_STORE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as exited:
        main()
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "where the time went" in out
    assert "input_bound: waiting for data took" in out and "num_workers" in out
    assert f"trace: {run_dir / 'trace-steps-5-8.pt.trace.json'}" in out


@pytest.mark.slow
def test_heavy_model_with_fast_loader_is_compute_bound_and_gets_no_finding(
        project: Project) -> None:
    profile, stderr = run_scenario(project, "heavy", "compute_bound", "--set", "steps=30",
                                   "--set", "batch_size=256")
    assert finding_ids(profile) == []
    assert profile["breakdown"]["compute"]["pct"] > 80
    assert profile["throughput"]["samples_per_s"] == pytest.approx(
        256 * profile["throughput"]["steps_per_s"], rel=1e-3)
    assert "no bottleneck found" in stderr


def test_stall_every_ten_steps_is_step_outliers_with_the_period(project: Project) -> None:
    profile, _ = run_scenario(project, "stalls", "stalls", "--set", "steps=60")
    assert finding_ids(profile) == ["step_outliers"]
    evidence = profile["findings"][0]["evidence"]
    assert evidence["period_steps"] == 10
    assert {10, 20, 30, 40, 50, 60} <= set(evidence["steps"])
    assert "every 10 steps" in profile["findings"][0]["message"]


@pytest.mark.slow
def test_tensors_kept_across_steps_are_memory_growth(project: Project) -> None:
    # the monitor's memory_growth rule stops such a run (exit 3) long before the planned 400
    # steps (sampling sized to the run: ~50 steps, under the profiler's 100 MB of evidence)
    _, stderr = run_scenario(project, "leak", "leak", "--set", "steps=400", exit_code=3)
    assert "stopped (rule:memory_growth)" in stderr
    # with that rule only alerting, the run goes on and the profiler names the same cause
    profile, _ = run_scenario(
        project, "leak-observed", "leak", "--set", "steps=400",
        settings=NO_CHECKPOINTS + "monitor: {rules: {memory_growth: {action: [alert]}}}\n")
    assert finding_ids(profile) == ["memory_growth"]
    evidence = profile["findings"][0]["evidence"]
    assert evidence["series"] == "rss_mb" and evidence["growth_mb"] > 150  # 2 MB a step


@pytest.mark.slow
def test_checkpoint_at_every_step_is_checkpoint_overhead(project: Project) -> None:
    profile, _ = run_scenario(project, "ckpt", "checkpoint", "--set", "steps=30",
                              settings=FAST_SAMPLING + "checkpoint: {every: 1steps, mode: sync}\n")
    assert finding_ids(profile) == ["checkpoint_overhead"]
    evidence = profile["findings"][0]["evidence"]
    assert evidence["count"] >= 30 and evidence["suggested_every_steps"] > 1
    assert evidence["reasons"]["periodic"] >= 30  # each told apart from a best kept, a stop
    assert profile["counts"]["checkpoints"] >= 30


@pytest.mark.slow
def test_prudent_show_json_has_the_profile_and_its_findings(project: Project) -> None:
    profile, _ = run_scenario(project, "shown", "stalls", "--set", "steps=30")
    detail = project.show("shown")
    assert detail["profile"]["num_steps"] == 30
    assert detail["profile"]["breakdown"] == profile["breakdown"]
    assert [f["id"] for f in detail["findings"]] == finding_ids(profile) == ["step_outliers"]


@pytest.mark.slow
def test_window_past_the_end_is_reported_and_training_is_unaffected(project: Project) -> None:
    profile, stderr = run_scenario(project, "late", "compute_bound", "--set", "steps=20",
                                   "--set", "batch_size=8", "--profile-steps", "1000:1010")
    assert "--profile-steps 1000:1010 was not traced: training ends at step 20" in stderr
    assert profile["num_steps"] == 20 and profile["trace"]["steps"] == "1000:1010"
    assert not list((project.path / ".prudent" / "runs" / "late").glob("trace-*"))


def test_inverted_profile_steps_exit_2_before_anything_is_written(project: Project) -> None:
    result = project.prudent("run", "--profile-steps", "10:5", "--", sys.executable,
                             script("profile_bottlenecks.py"))
    assert result.returncode == 2
    assert result.stderr == ("prudent: error: --profile-steps '10:5' is inverted: STOP must be "
                             "greater than START, e.g. 10:20 to trace 10 steps\n")
    assert not Path(project.path / ".prudent").exists()
