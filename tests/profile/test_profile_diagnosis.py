"""The rules: each fires on its bottleneck, stays silent on a healthy run, and names numbers."""

from __future__ import annotations

from typing import Any

import pytest

from prudent.profile.diagnosis import RULES, Facts, Thresholds, diagnose
from prudent.profile.timer import Outlier


def facts(data: float = 1.0, compute: float = 9.0, checkpoint: float = 0.0, eval_: float = 0.0,
          other: float = 0.0, num_steps: int = 100, **kwargs: Any) -> Facts:
    breakdown = {"data": data, "compute": compute, "checkpoint": checkpoint, "eval": eval_,
                 "other": other}
    return Facts(num_steps=num_steps, breakdown=breakdown, **kwargs)


def gpu_samples(util: float, cpu: float, n: int = 20, **extra: float) -> list[dict[str, Any]]:
    return [{"t": float(i), "step": i + 1, "cpu_pct": cpu, "rss_mb": 1000.0,
             "gpus": [{"util_pct": util, "mem_used_mb": 1000.0, "mem_total_mb": 80_000.0}],
             **extra} for i in range(n)]


def ids(found: list[Any]) -> list[str]:
    return [f.id for f in found]


def test_a_healthy_cpu_run_has_no_finding() -> None:
    assert diagnose(facts()) == []


def test_every_rule_is_silent_on_a_healthy_gpu_run() -> None:
    healthy = facts(device="cuda:0", gpu_index=0, samples=gpu_samples(util=97, cpu=40),
                    device_total_mb=80_000, device_peak_reserved_mb=70_000)
    assert [rule.__name__ for rule in RULES if rule(healthy, Thresholds())] == []


def test_input_bound_fires_at_the_tensorflow_threshold_and_names_the_share() -> None:
    assert diagnose(facts(data=1.9, compute=8.1)) == []
    (finding,) = diagnose(facts(data=2.0, compute=8.0))
    assert finding.id == "input_bound" and finding.evidence["data_pct"] == 20.0
    assert "20% of step time (20.0 ms of 100.0 ms a step" in finding.message
    assert "num_workers" in finding.message and "pin_memory" not in finding.message
    on_gpu = diagnose(facts(data=5.0, compute=5.0, device="cuda:0"))
    assert "pin_memory=True" in on_gpu[0].message


def test_thresholds_are_configurable() -> None:
    found = diagnose(facts(data=1.0, compute=9.0), Thresholds(input_bound_pct=5))
    assert ids(found) == ["input_bound"]


def test_a_run_too_short_to_tell_gets_no_finding() -> None:
    assert diagnose(facts(data=9.0, compute=1.0, num_steps=19)) == []


def test_idle_gpu_with_a_busy_cpu_is_cpu_bound_not_low_utilization() -> None:
    found = diagnose(facts(device="cuda:0", gpu_index=0, samples=gpu_samples(util=20, cpu=99)))
    assert ids(found) == ["cpu_bound"]
    assert found[0].evidence == {"gpu_util_median_pct": 20.0, "process_cpu_median_pct": 99.0,
                                 "num_samples": 16}


def test_idle_gpu_with_no_other_explanation_is_low_gpu_utilization() -> None:
    found = diagnose(facts(device="cuda:0", gpu_index=0, samples=gpu_samples(util=30, cpu=40)))
    assert ids(found) == ["low_gpu_utilization"]
    assert "busy a median 30%" in found[0].message


def test_idle_gpu_waiting_for_data_is_only_input_bound() -> None:
    found = diagnose(facts(data=6.0, compute=4.0, device="cuda:0", gpu_index=0,
                           samples=gpu_samples(util=15, cpu=40)))
    assert ids(found) == ["input_bound"]


def test_gpu_rules_need_gpu_readings() -> None:
    assert diagnose(facts(device="cuda:0", gpu_index=None, samples=gpu_samples(10, 99))) == []
    assert diagnose(facts(device="cpu", samples=gpu_samples(util=0, cpu=100))) == []


def test_mostly_free_device_memory_is_small_batch_with_a_factor() -> None:
    found = diagnose(facts(device="cuda:0", gpu_index=0, samples=gpu_samples(util=80, cpu=40),
                           device_total_mb=80_000, device_peak_reserved_mb=8_000))
    assert ids(found) == ["small_batch"]
    assert found[0].evidence["headroom_factor"] == 8 and "about 8x larger" in found[0].message


def outliers(steps: list[int], duration: float = 0.1, wait: float = 0.0) -> list[Outlier]:
    return [Outlier(step, duration, wait, 0.01) for step in steps]


def test_periodic_stalls_are_step_outliers_with_their_period() -> None:
    stalls = outliers([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 57])
    (finding,) = diagnose(facts(outliers=sorted(stalls, key=lambda o: o.step), num_outliers=11,
                                outlier_excess_s=11 * 0.09))
    assert finding.id == "step_outliers" and finding.evidence["period_steps"] == 10
    assert "every 10 steps" in finding.message and "mostly in compute" in finding.message


def test_stalls_at_each_epoch_start_point_to_persistent_workers() -> None:
    stalls = outliers([1, 51, 101, 151], duration=0.5, wait=0.45)
    (finding,) = diagnose(facts(outliers=stalls, num_outliers=4, outlier_excess_s=4 * 0.49,
                                batches_per_epoch=50, num_steps=200))
    assert "persistent_workers=True" in finding.message and "waiting for data" in finding.message


def test_rare_or_cheap_outliers_are_not_a_finding() -> None:
    few = facts(outliers=outliers([10, 20]), num_outliers=2, outlier_excess_s=0.18)
    cheap = facts(outliers=outliers([10, 20, 30]), num_outliers=3, outlier_excess_s=0.27)
    assert diagnose(few) == [] and diagnose(cheap) == []  # 0.27 s of 10 s is under 5%


def memory(values: list[float]) -> list[dict[str, Any]]:
    return [{"t": float(i), "step": i + 1, "rss_mb": v} for i, v in enumerate(values)]


def test_memory_that_keeps_growing_is_memory_growth() -> None:
    (finding,) = diagnose(facts(samples=memory([500 + 20 * i for i in range(30)])))
    assert finding.id == "memory_growth"
    assert finding.evidence["growth_mb"] == pytest.approx(420, abs=30)
    assert "append loss.item(), not loss" in finding.message


def test_memory_that_grows_then_levels_off_is_a_cache_not_a_leak() -> None:
    values = [500 + 40 * min(i, 15) for i in range(30)]
    assert diagnose(facts(samples=memory(values))) == []


def test_small_or_noisy_memory_changes_are_not_a_finding() -> None:
    assert diagnose(facts(samples=memory([2000 + i for i in range(30)]))) == []
    assert diagnose(facts(samples=memory([500, 900, 500, 900] * 8))) == []


def test_checkpoint_overhead_suggests_an_interval() -> None:
    (finding,) = diagnose(facts(data=0.0, compute=10.0, checkpoint=3.0, num_checkpoints=100))
    evidence = finding.evidence
    assert finding.id == "checkpoint_overhead" and evidence["checkpoint_pct"] == pytest.approx(23.1)
    # 30 ms a save, 100 ms a step: every 12 steps brings it to 2.5%
    assert evidence["suggested_every_steps"] == 12 and "save every 12 steps" in finding.message
    assert diagnose(facts(compute=10.0, checkpoint=0.4, num_checkpoints=1)) == []


def test_checkpoint_overhead_names_what_made_the_saves() -> None:
    # the demo's short run: the first save, then early stopping's best at each better
    # evaluation; no interval changes those, so the advice is not one
    (finding,) = diagnose(facts(compute=10.0, checkpoint=1.0, num_checkpoints=5,
                                checkpoint_reasons={"periodic": 1, "keep:best": 4}))
    assert "(5 saves: 4 early stopping's best, 1 on schedule;" in finding.message
    assert "restore_best: false" in finding.message and "save every" not in finding.message
    assert finding.evidence["reasons"] == {"periodic": 1, "keep:best": 4}
    # saves on schedule: the interval is theirs alone (60 steps over 3, not over 4)
    (finding,) = diagnose(facts(compute=10.0, checkpoint=1.0, num_checkpoints=4, num_steps=60,
                                checkpoint_reasons={"periodic": 2, "epoch_end": 1,
                                                    "keep:best": 1}))
    assert "(now every 20: checkpoint.every)" in finding.message


def test_eval_overhead_needs_three_evaluations_before_it_advises() -> None:
    assert diagnose(facts(data=0.0, compute=10.0, eval_=5.0, num_evals=1)) == []
    assert diagnose(facts(data=0.0, compute=10.0, eval_=5.0, num_evals=2)) == []
    (finding,) = diagnose(facts(data=0.0, compute=10.0, eval_=5.0, num_evals=3))
    assert finding.id == "eval_overhead" and "3 evaluations" in finding.message


def test_eval_overhead_fires_above_its_threshold() -> None:
    (finding,) = diagnose(facts(data=0.0, compute=10.0, eval_=5.0, num_evals=5))
    assert finding.id == "eval_overhead" and "5 evaluations, 1000 ms each" in finding.message
    assert diagnose(facts(data=0.0, compute=10.0, eval_=1.0, num_evals=5)) == []
