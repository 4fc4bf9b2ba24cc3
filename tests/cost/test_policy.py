"""Every policy rule: a job that breaks it is refused with the rule, the numbers and a fix;
the same job changed as the message says complies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from prudent.cost.catalog import load_catalog
from prudent.cost.policy import Job, Spend, check_job, job_from_settings, load_policy, project_spend
from prudent.cost.settings import CostSettings, PolicySettings
from prudent.kernel.errors import ConfigError
from prudent.store.database import Store
from prudent.wiring.config import load_settings

CATALOG = load_catalog(CostSettings(skypilot_catalogs=False))  # the bundled prices only
G5 = CATALOG.lookup("aws:g5.xlarge")  # 1 x A10G, $1.006/h, spot $0.4328/h
P4D = CATALOG.lookup("aws:p4d.24xlarge")  # 8 x A100, $21.957642/h, spot $6.5323/h
LAMBDA = CATALOG.lookup("lambda:gpu_8x_a100")  # 8 x A100, $10.32/h, no spot market


def _rules(policy: dict, job: Job, spend: Spend | None = None) -> list[str]:
    spend = spend or Spend()
    return [v.rule for v in check_job(PolicySettings(**policy), job, spend, CATALOG)]


# (policy, a job that breaks it, words the message must hold, the same job made to comply)
CASES = [
    ({"allowed_instances": ["aws:g5.*", "gcp:g2-*"]}, Job(instance=P4D),
     ["aws:p4d.24xlarge", "aws:g5.*, gcp:g2-*", "--instance gcp:g2-standard-4"], Job(instance=G5)),
    ({"max_gpus_per_job": 8}, Job(instance=P4D, nodes=2),
     ["16 GPUs", "max_gpus_per_job=8"], Job(instance=P4D, nodes=1)),
    ({"max_hours_per_job": 12}, Job(instance=G5, hours=20),
     ["20 h", "max_hours_per_job=12 h", "--max-hours 12"], Job(instance=G5, hours=12)),
    ({"max_hourly_usd": 10}, Job(instance=P4D),
     ["$21.96/h", "max_hourly_usd $10.00", "--spot ($6.53/h)"], Job(instance=G5)),
    ({"max_parallel_trials": 4}, Job(kind="tune", instance=G5, parallel=8),
     ["8 parallel trials", "max_parallel_trials=4"], Job(kind="tune", instance=G5, parallel=4)),
    ({"require_spot": ["tune"]}, Job(kind="tune", instance=G5),
     ["require_spot", "tune jobs", "add --spot"], Job(kind="tune", instance=G5, spot=True)),
    ({"require_spot": True}, Job(kind="run", instance=G5),
     ["run jobs", "add --spot"], Job(kind="run", instance=G5, spot=True)),
    ({"max_usd_per_job": "$50"}, Job(instance=P4D, hours=3),
     ["projected $65.87", "max_usd_per_job $50.00", "at most 2.28 h"], Job(instance=P4D, hours=1.5)),
    ({"require_spot": True}, Job(kind="run", instance=LAMBDA),
     ["Lambda Cloud sells no spot", "pick a type with a spot price", "--instance aws:p4d.24xlarge "
      "--spot"], Job(kind="run", instance=P4D, spot=True)),
    ({"allowed_instances": ["nebius:gpu-h100-*", "runpod:*"]}, Job(instance=LAMBDA),
     ["lambda:gpu_8x_a100", "--instance runpod:1x_A100-80GB_SECURE"],
     Job(instance=CATALOG.lookup("nebius:gpu-h100-sxm_8gpu-128vcpu-1600gb"))),
    ({"max_usd_per_job": 50}, Job(instance=G5, budget_usd=80),
     ["budget $80.00", "--budget-usd 50"], Job(instance=G5, budget_usd=50)),
]


@pytest.mark.parametrize(("policy", "bad", "words", "good"), CASES,
                         ids=[f"{next(iter(c[0]))}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_refuses_with_numbers_and_a_fix_and_the_fix_complies(
        policy: dict, bad: Job, words: list[str], good: Job) -> None:
    (violation,) = check_job(PolicySettings(**policy), bad, Spend(), CATALOG)
    assert violation.rule == next(iter(policy)).replace("max_usd_per_job", "max_usd_per_job")
    for word in words:
        assert word in violation.message, violation.message
    assert check_job(PolicySettings(**policy), good, Spend(), CATALOG) == []


@pytest.mark.parametrize("window", ["day", "month"])
def test_project_windows_count_what_was_spent_and_what_the_job_would_add(window: str) -> None:
    policy = {f"max_usd_per_{window}": 100}
    job = Job(instance=G5, hours=10)  # $10.06
    assert _rules(policy, job, Spend(day_usd=80, month_usd=80)) == []
    (message,) = [v.message for v in check_job(PolicySettings(**policy), job,
                                                Spend(day_usd=95, month_usd=95), CATALOG)]
    assert f"spent $95.00 this {window}" in message and "projected $10.06" in message
    assert "at most 4.97 h" in message
    spent_out = check_job(PolicySettings(**policy), replace(job, hours=None),
                          Spend(day_usd=100, month_usd=100), CATALOG)
    assert [v.rule for v in spent_out] == [f"max_usd_per_{window}"]
    assert f"wait for the next {window}" in spent_out[0].message


def test_a_job_without_instance_or_hours_only_meets_the_rules_it_can_state() -> None:
    strict = {"allowed_instances": ["aws:g5.*"], "require_spot": True, "max_usd_per_job": 1,
              "max_gpus_per_job": 0}
    assert _rules(strict, Job()) == []  # enforced while it runs, by the meter


def test_empty_policy_allows_everything() -> None:
    assert _rules({}, Job(instance=P4D, nodes=64, hours=1000)) == []


def test_policy_file_replaces_the_section_and_rejects_unknown_keys(tmp_path: Path,
                                                                   home: Path) -> None:
    good = tmp_path / "policy.yaml"
    good.write_text("max_gpus_per_job: 4\nrequire_spot: [run]\n")
    settings = load_settings(overrides={("cost", "policy_file"): str(good)})
    assert load_policy(settings).max_gpus_per_job == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_gpus_per_job: 4\nmax_gpu: 3\n")
    settings = load_settings(overrides={("cost", "policy_file"): str(bad)})
    with pytest.raises(ConfigError, match="unknown policy key 'max_gpu'; allowed: allowed_instances"):
        load_policy(settings)


@pytest.mark.parametrize(("yaml_text", "expected"), [
    ("policy: {max_usd_per_day: -3}\n", "policy.max_usd_per_day=-3 is invalid: it must be >= 0"),
    ("policy: {require_spot: [train]}\n", "policy.require_spot"),
    ("cost: {budget_usd: '-$5'}\n", "cost.budget_usd='-$5' is invalid"),
    ("cost: {nodes: 0}\n", "cost.nodes=0 is invalid"),
])
def test_bad_cost_and_policy_settings_are_one_clear_error(home: Path, yaml_text: str,
                                                           expected: str) -> None:
    (home.parent / "prudent.yaml").write_text(yaml_text)
    with pytest.raises(ConfigError, match=expected.replace("$", r"\$")):
        load_settings()


def test_project_spend_sums_stored_costs_of_today_and_this_month(home: Path) -> None:
    store = Store(f"sqlite:///{home.parent / 'p.db'}")
    now = 1_796_000_000.0  # a fixed UTC instant mid-month
    for run_id, age_days, usd in [("a", 0.01, 2.0), ("b", 3, 5.0), ("c", 40, 100.0)]:
        store.create_run(run_id, "x", started_at=now - age_days * 86400, cost_usd=usd)
    assert project_spend(store, now=now) == Spend(day_usd=2.0, month_usd=7.0)
    assert project_spend(store, exclude="a", now=now) == Spend(day_usd=0.0, month_usd=5.0)
    store.close()


@pytest.mark.parametrize("ref", ["lambda:gpu_8x_a100", "nebius:gpu-b200-sxm_8gpu-160vcpu-1792gb"])
def test_spot_where_the_catalog_has_no_spot_price_is_refused_not_invented(ref: str) -> None:
    with pytest.raises(ConfigError) as info:
        job_from_settings(CostSettings(instance=ref, spot=True), CATALOG)
    message = str(info.value)
    assert message.startswith(f"--spot on {ref}: ") and "drop --spot" in message
    assert job_from_settings(CostSettings(instance=ref), CATALOG).hourly_usd > 0


def test_new_clouds_are_priced_and_counted_like_the_others() -> None:
    job = job_from_settings(CostSettings(instance="runpod:8x_A100-80GB_SECURE", spot=True,
                                         nodes=2, max_hours="10"), CATALOG)
    assert (job.hourly_usd, job.num_gpus) == (19.04, 16)
    assert job.projected_usd == pytest.approx(190.4)
