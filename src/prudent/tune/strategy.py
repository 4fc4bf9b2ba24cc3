"""How a study searches and prunes: prudent's defaults, built on Optuna's samplers and pruners.

One place decides the defaults, so ``prudent tune``, ``prudent.tune(...)`` and
``benchmarks/tuning.py`` all measure the same thing. Names are the CLI's ``--sampler`` and
``--pruner`` values; resources are epochs (each ``run.log`` is one intermediate value).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from prudent.kernel.errors import ConfigError

if TYPE_CHECKING:
    import optuna

__all__ = ["DEFAULT_PRUNER", "DEFAULT_SAMPLER", "PRUNERS", "SAMPLERS", "make_pruner",
           "make_sampler"]

SAMPLERS = ("tpe", "gp", "cmaes", "random")
PRUNERS = ("hyperband", "asha", "median", "none")
DEFAULT_SAMPLER = "tpe"
# ASHA rather than Hyperband by default: Optuna's HyperbandPruner shows the sampler only the
# trials of the current trial's bracket, so TPE spends its 10 random startup trials once per
# bracket (4 brackets for 27 epochs, 5 for 81) and models a fraction of the study; ASHA keeps one
# pool, so TPE learns from every trial, pruned ones included, and it is asynchronous by design
# (parallel workers never wait for a rung to fill). Chosen before the reported benchmark run, on
# development seeds of its synthetic tier only; benchmarks/tuning.py and docs/benchmarks.md give the
# numbers, losses included.
DEFAULT_PRUNER = "asha"


def make_sampler(name: str = DEFAULT_SAMPLER, *, workers: int = 1,
                 seed: int | None = None) -> optuna.samplers.BaseSampler:
    """An Optuna sampler. TPE is multivariate, with the constant liar when workers share a study
    (so that parallel workers do not all sample next to the same running trial)."""
    import optuna

    if name == "tpe":
        with warnings.catch_warnings():  # ``group`` (for conditional spaces) is "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(multivariate=True, group=True,
                                              constant_liar=workers > 1, seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"unknown sampler {name!r}; choose one of: {', '.join(SAMPLERS)}")


def make_pruner(name: str = DEFAULT_PRUNER, *, max_resource: int | str = "auto",
                min_resource: int = 1, reduction_factor: int = 3) -> optuna.pruners.BasePruner:
    """An Optuna pruner keyed on the epoch (the step of each intermediate value)."""
    import optuna

    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=min_resource, max_resource=max_resource,
                                              reduction_factor=reduction_factor)
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=min_resource,
                                                      reduction_factor=reduction_factor)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=min_resource)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"unknown pruner {name!r}; choose one of: {', '.join(PRUNERS)}")
