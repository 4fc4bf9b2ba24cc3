"""The tuning benchmark's synthetic tier: the test functions, crossing curves, budget accounting."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("optuna")
tuning = pytest.importorskip("benchmarks.tuning")

BRANIN_MINIMISERS = [(0.123895, 0.818333), (0.542773, 0.151667), (0.961652, 0.165)]
HARTMANN6_MINIMISER = (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)
HARTMANN6_LOCAL = (0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381)  # value -3.2032


@pytest.mark.parametrize("x", BRANIN_MINIMISERS)
def test_branin_reaches_its_known_minimum_at_each_minimiser(x: tuple[float, float]) -> None:
    assert tuning.branin(np.array(x)) == pytest.approx(0.397887, abs=1e-5)


def test_hartmann6_reaches_its_known_minimum() -> None:
    assert tuning.hartmann6(np.array(HARTMANN6_MINIMISER)) == pytest.approx(-3.32237, abs=1e-5)


@pytest.mark.parametrize("name", ["branin", "hartmann6"])
def test_no_random_point_beats_the_known_minimum(name: str) -> None:
    curves = tuning.CURVES[name]
    points = np.random.default_rng(0).random((2000, curves.dim))
    assert min(curves.f(x) for x in points) >= curves.f_min - 1e-6


@pytest.mark.parametrize(("name", "fast", "slow"), [
    ("branin", (0.15, 0.8), BRANIN_MINIMISERS[2]),
    ("hartmann6", HARTMANN6_LOCAL, HARTMANN6_MINIMISER),
])
def test_curves_cross_so_that_early_pruning_can_be_wrong(name: str, fast: tuple[float, ...],
                                                         slow: tuple[float, ...]) -> None:
    curves, fast_x, slow_x = tuning.CURVES[name], np.array(fast), np.array(slow)
    for early in (1, 3, 9):  # the first three rungs of Hyperband with reduction factor 3
        assert curves.loss(fast_x, early) < curves.loss(slow_x, early)
    assert curves.loss(fast_x, tuning.R_A) > curves.loss(slow_x, tuning.R_A)


class CountingProblem(tuning.SyntheticProblem):
    """Counts every step read, whatever happens to the trial afterwards."""

    steps_read = 0

    def train(self, params, number, limit, report):  # type: ignore[no-untyped-def]
        def counted(step: int, value: float) -> bool:
            self.steps_read += 1
            return report(step, value)

        return super().train(params, number, limit, counted)


def test_budget_counts_the_steps_of_pruned_trials_and_is_never_exceeded() -> None:
    problem = CountingProblem(tuning.CURVES["branin"], seed=0)
    cell = tuning.run_study(problem, "a", "branin", "random+sha", seed=0)
    assert cell.trials["pruned"] > 0
    assert cell.used == problem.steps_read == tuning.BUDGET_A
    assert cell.final == pytest.approx(tuning.CURVES["branin"].loss(
        np.array(list(cell.best_params.values())), tuning.R_A))
