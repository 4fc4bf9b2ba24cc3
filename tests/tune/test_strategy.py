"""prudent's default sampler and pruner, and the names the CLI accepts."""

from __future__ import annotations

import pytest

from prudent.kernel.errors import ConfigError

optuna = pytest.importorskip("optuna")
strategy = pytest.importorskip("prudent.tune.strategy")


def test_default_sampler_is_multivariate_grouped_tpe_without_liar_for_one_worker() -> None:
    sampler = strategy.make_sampler(seed=0)
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert (sampler._multivariate, sampler._group, sampler._constant_liar) == (True, True, False)


def test_sampler_uses_the_constant_liar_when_workers_share_a_study() -> None:
    assert strategy.make_sampler("tpe", workers=2, seed=0)._constant_liar is True


def test_default_pruner_is_asha_from_the_first_epoch_with_reduction_factor_3() -> None:
    pruner = strategy.make_pruner(max_resource=27)
    assert strategy.DEFAULT_PRUNER == "asha"
    assert isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner)
    assert (pruner._min_resource, pruner._reduction_factor) == (1, 3)


def test_every_listed_name_builds() -> None:
    for name in strategy.PRUNERS:
        assert isinstance(strategy.make_pruner(name, max_resource=9), optuna.pruners.BasePruner)
    for name in ("tpe", "random"):
        assert isinstance(strategy.make_sampler(name, seed=0), optuna.samplers.BaseSampler)


@pytest.mark.parametrize(("make", "name", "choices"), [
    (strategy.make_sampler, "bayes", "tpe, gp, cmaes, random"),
    (strategy.make_pruner, "sha", "hyperband, asha, median, none"),
])
def test_unknown_name_is_rejected_with_the_choices(make, name: str, choices: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=f"unknown .* {name!r}; choose one of: {choices}"):
        make(name)
