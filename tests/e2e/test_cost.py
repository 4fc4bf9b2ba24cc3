"""Cost governance end to end: real `prudent` commands, real training in subprocesses."""

from __future__ import annotations

import json
import sys

import pytest

from tests.e2e.conftest import Project, script

# a fake machine at $1 a second, so a few seconds of real training reach a budget
PRICEY = ("cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n"
          "test,pricey,lab,A100,1,8,64,3600,1800,2026-12-01\n")


def _cost_project(project: Project) -> Project:
    (project.path / "prices.csv").write_text(PRICEY)
    (project.path / "prudent.yaml").write_text(
        "cost: {catalog_file: prices.csv, stop_margin: 0s, update_interval_s: 0.5, detect: 'off'}\n")
    (project.path / "policy.yaml").write_text(
        "allowed_instances: ['test:*', 'aws:g5.*']\nmax_usd_per_job: 1000\n")
    return project


def test_budget_stop_checkpoints_and_a_raised_budget_resumes_to_the_end(project: Project) -> None:
    _cost_project(project)
    train = ["--", sys.executable, script("cost_train.py"), ]
    args = ["run", "--run-id", "b1", "--instance", "test:pricey", "--policy", "policy.yaml",
            "--set", "sleep_s=0.07", "--set", "epochs=2"]  # 80 steps, about 6 s
    first = project.prudent(*args, "--budget-usd", "$5", *train)
    assert first.returncode == 4, first.stderr
    assert "budget_usd $5.00 reached: spent $" in first.stderr and "DONE" not in first.stdout
    stopped = project.show("b1")
    assert (stopped["status"], stopped["stop_reason"]) == ("stopped", "budget")
    assert 0 < stopped["step"] < 80 and stopped["cost_usd"] > 0
    # the meter counts from prudent.init: on a loaded machine the setup alone may pass $5
    assert stopped["step"] == 1 or stopped["cost_usd"] <= 5.5
    saved = [e for e in stopped["events"] if e["name"] == "saved"]
    assert saved and saved[-1]["step"] == stopped["step"]  # the stop wrote a checkpoint

    second = project.prudent(*args, "--budget-usd", "1000", *train)
    assert second.returncode == 0, second.stderr
    assert "DONE 80" in second.stdout
    done = project.show("b1")
    assert (done["status"], done["step"], done["restarts"]) == ("completed", 80, 1)
    assert any(e["name"] == "resumed" for e in done["events"])
    cost = done["cost"]
    assert cost["attempts"] == 2 and cost["prior_usd"] == pytest.approx(stopped["cost_usd"])
    assert done["cost_usd"] == pytest.approx(cost["total_usd"])
    assert done["cost_usd"] > stopped["cost_usd"]
    assert cost["instance"] == "test:pricey" and cost["hourly_usd"] == 3600.0
    bill = project.prudent("cost", "--json", "--by", "instance")
    assert bill.returncode == 0, bill.stderr
    (line,) = json.loads(bill.stdout)["groups"]
    assert line["key"] == "test:pricey" and line["spent_usd"] == pytest.approx(done["cost_usd"], abs=1e-3)


REFUSALS = [
    ("allowed_instances: ['aws:g5.*']", ["--instance", "aws:p4d.24xlarge"],
     "[allowed_instances] instance aws:p4d.24xlarge is not allowed"),
    # every rule is unit-tested in tests/cost/test_policy.py; end to end, the rest run with -m slow
    pytest.param("require_spot: [run]", ["--instance", "aws:g5.xlarge"], "[require_spot]",
                 marks=pytest.mark.slow),
    pytest.param("max_usd_per_job: 50", ["--instance", "aws:g5.xlarge", "--budget-usd", "80"],
                 "[max_usd_per_job] budget $80.00 exceeds policy max_usd_per_job $50.00",
                 marks=pytest.mark.slow),
    pytest.param("max_gpus_per_job: 8", ["--instance", "aws:p4d.24xlarge", "--nodes", "2"],
                 "[max_gpus_per_job] 16 GPUs", marks=pytest.mark.slow),
    pytest.param("max_hours_per_job: 12", ["--max-hours", "20"],
                 "[max_hours_per_job] 20 h exceed", marks=pytest.mark.slow),
    pytest.param("max_hourly_usd: 10", ["--instance", "aws:p4d.24xlarge"],
                 "[max_hourly_usd] $21.96/h", marks=pytest.mark.slow),
    pytest.param("max_usd_per_day: 5", ["--instance", "aws:p4d.24xlarge", "--max-hours", "1"],
                 "[max_usd_per_day] the project spent $0.00", marks=pytest.mark.slow),
    pytest.param("max_usd_per_month: 5", ["--instance", "aws:p4d.24xlarge", "--max-hours", "1"],
                 "[max_usd_per_month]", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("policy", "flags", "expected"), REFUSALS)
def test_a_job_the_policy_forbids_is_refused_before_it_starts(
        project: Project, policy: str, flags: list[str], expected: str) -> None:
    (project.path / "policy.yaml").write_text(policy + "\n")
    result = project.prudent("run", "--policy", "policy.yaml", *flags, "--", sys.executable,
                             script("cost_train.py"))
    assert result.returncode == 6, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("prudent: error: refused by policy: ") and expected in line
    assert not (project.path / ".prudent").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["--instance", "aws:p4d.24xlarg"],
     "unknown instance type 'aws:p4d.24xlarg': did you mean aws:p4d.24xlarge"),
    pytest.param(["--budget-usd", "-5"], "cost.budget_usd='-5' is invalid: it must be >= 0 "
                 "dollars", marks=pytest.mark.slow),  # also in tests/cost/test_policy.py
    (["--policy", "bad_policy.yaml"], "unknown policy key 'max_gpu'; allowed: allowed_instances"),
])
def test_bad_cost_input_is_one_line_exit_2_before_anything_starts(
        project: Project, args: list[str], expected: str) -> None:
    (project.path / "bad_policy.yaml").write_text("max_gpu: 4\n")
    result = project.prudent("run", *args, "--", sys.executable, script("cost_train.py"))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("prudent: error: ") and expected in line
    assert not (project.path / ".prudent").exists()


def test_policy_check_prints_the_projected_cost_and_exits_0_or_1(project: Project) -> None:
    (project.path / "policy.yaml").write_text("max_gpus_per_job: 4\nmax_usd_per_job: 50\n")
    ok = project.prudent("policy", "check", "--policy", "policy.yaml", "--instance",
                         "aws:g5.xlarge", "--hours", "10", "--spot")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0] == ("projected cost $4.33: 10 h at $0.43/h "
                                         "(aws:g5.xlarge spot x 1 node)")
    bad = project.prudent("policy", "check", "--policy", "policy.yaml", "--instance",
                          "aws:p4d.24xlarge", "--hours", "10")
    assert bad.returncode == 1
    assert "violates max_gpus_per_job: 8 GPUs" in bad.stdout
    assert "violates max_usd_per_job: projected $219.58" in bad.stdout


@pytest.mark.slow  # the rows themselves are checked in tests/cost/test_catalog.py
def test_catalog_lists_dated_prices_as_json(project: Project) -> None:
    result = project.prudent("catalog", "--cloud", "azure", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) >= 8 and {r["cloud"] for r in rows} == {"azure"}
    assert all(r["prices_as_of"] and r["on_demand_usd"] > r["spot_usd"] > 0 for r in rows)


def test_the_policy_counts_the_gpus_a_torchrun_command_will_use(project: Project) -> None:
    (project.path / "policy.yaml").write_text("max_gpus_per_job: 4\n")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    eight = project.prudent("run", "--policy", "policy.yaml", "--instance", "aws:p4d.24xlarge",
                            "--", *torchrun, "--nproc-per-node", "8", script("cost_train.py"))
    assert eight.returncode == 6, eight.stderr
    assert "[max_gpus_per_job] 8 GPUs" in eight.stderr

    from prudent.cost.launch import check_launch
    from prudent.wiring.config import load_settings

    settings = load_settings(overrides={("cost", "instance"): "aws:p4d.24xlarge",
                                        ("cost", "policy_file"): str(project.path / "policy.yaml")})
    two = check_launch(settings, command=[*torchrun, "--nproc-per-node", "2", "train.py"])
    assert two.gpus == 2  # 2 processes on an 8-GPU machine: within the policy's 4
