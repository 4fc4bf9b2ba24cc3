"""The overfitting rule on validation curves a person would call healthy or sick."""

from __future__ import annotations

from prudent.monitor.base import EvalSample
from prudent.monitor.rules.progress import OverfittingRule


def _first_finding(val_losses: list[float]) -> int | None:
    rule = OverfittingRule()
    for i, value in enumerate(val_losses):
        sample = EvalSample(step=240 * (i + 1), metrics={"val_loss": value},
                            train_loss=1.0 - 0.05 * i)  # training keeps improving
        if rule._judge(sample) is not None:
            return sample.step
    return None


def test_a_noisy_validation_that_recovers_is_not_overfitting() -> None:
    # measured on the healthy MLP of the monitoring benchmark (torch 2.13): the best at
    # epoch 3, two worse evaluations, then one on its way back down
    assert _first_finding([1.025, 1.016, 0.9639, 0.9936, 0.9969, 0.9778]) is None


def test_a_validation_that_keeps_rising_is_overfitting_after_patience() -> None:
    assert _first_finding([1.0, 0.9, 0.95, 0.97, 1.02, 1.1]) == 240 * 5


def test_a_recovery_holds_the_count_instead_of_clearing_it() -> None:
    # worse, worse, a little better (still worse than the best), worse again: 3 that count
    assert _first_finding([0.9, 1.0, 1.05, 1.02, 1.08]) == 240 * 5


def _judged(metrics: list[dict[str, float]]) -> tuple[OverfittingRule, int | None]:
    rule = OverfittingRule()
    for i, logged in enumerate(metrics):
        sample = EvalSample(step=113 * (i + 1), metrics=logged, train_loss=2.31 - 0.04 * i)
        if rule._judge(sample) is not None:
            return rule, sample.step
    return rule, None


def test_without_a_val_loss_the_first_val_metric_is_watched_higher_is_better() -> None:
    # random labels, only val_acc logged (monitor_random_labels, seed 0): the training loss falls
    # (memorised labels) while the accuracy stays at chance below its first evaluation
    accuracy = [0.1152, 0.1094, 0.0801, 0.0859, 0.0762, 0.0762]
    rule, step = _judged([{"val_acc": a} for a in accuracy])
    assert rule.metric == "val_acc" and step == 113 * 5
    # a rising accuracy is not overfitting
    assert _judged([{"val_acc": 0.1 + 0.05 * i} for i in range(8)])[1] is None


def test_val_loss_is_preferred_when_logged_with_other_val_metrics() -> None:
    rule, _ = _judged([{"val_acc": 0.5, "val_loss": 1.0}])
    assert rule.metric == "val_loss"
