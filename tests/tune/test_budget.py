from __future__ import annotations

import pytest

from prudent.tune.budget import expected_epochs, next_trial_fits, project


def test_no_pruning_runs_every_trial_to_the_end() -> None:
    assert expected_epochs({"name": "none"}, 27) == (27.0, True)


def test_asha_expected_epochs_follow_the_rung_schedule() -> None:
    # rungs at 1, 3, 9 of 27 with rf 3: 1 + 2/3 + 6/9 + 18/27
    value, exact = expected_epochs({"name": "asha", "args": {}}, 27)
    assert exact and value == pytest.approx(1 + 2 / 3 + 6 / 9 + 18 / 27)


def test_hyperband_mixes_brackets_and_costs_more_than_asha_less_than_full() -> None:
    asha, _ = expected_epochs({"name": "asha"}, 27)
    hyperband, exact = expected_epochs({"name": "hyperband", "args": {"max_resource": 27}}, 27)
    assert exact and asha < hyperband < 27


def test_median_pruner_projection_is_an_upper_bound() -> None:
    assert expected_epochs({"name": "median"}, 10) == (10.0, False)


def test_projection_in_dollars_and_its_honest_unknowns() -> None:
    p = project(trials=10, pruner={"name": "none"}, max_epochs=5, epoch_s=36.0,
                epoch_s_source="given", hourly_usd=2.0, price_source="test", workers=2)
    assert p.total_epochs == 50 and p.usd == pytest.approx(1.0) and p.trial_usd == pytest.approx(0.1)
    unknown = project(trials=10, pruner={"name": "none"}, max_epochs=None, epoch_s=None,
                      epoch_s_source="", hourly_usd=2.0, price_source="test", workers=1)
    assert unknown.usd is None and "unknown" in unknown.lines()[0]


def test_next_trial_must_fit_with_the_running_ones_and_one_more() -> None:
    assert next_trial_fits(None, [5.0], [], None)[0]
    assert next_trial_fits(10.0, [1.0, 1.0], [0.5], None)[0]  # 2.5 + 0.5 + 1 = 4
    fits, why = next_trial_fits(3.5, [1.0, 1.0], [0.5], None)  # 4 > 3.5
    assert not fits and "would pass --budget-usd 3.50" in why
    assert not next_trial_fits(1.0, [], [], 2.0)[0]  # the projection alone says no
    assert not next_trial_fits(1.0, [1.0], [], 0.0)[0]  # spent all
