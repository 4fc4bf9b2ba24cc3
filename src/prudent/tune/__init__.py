"""Hyperparameter tuning on Optuna: each trial a supervised run of the user's unchanged script.

::

    space.py      the YAML search space (float/int/categorical, log, step, conditional)
    strategy.py   samplers and pruners: prudent's defaults
    study.py      storage (journal file or database URL), opening a study, its definition
    trial.py      the component inside a trial's process: report, prune, rules prune
    worker.py     one worker process: claim or ask a trial, run it, tell the result
    tuner.py      the coordinator: validate, project the cost, start workers, report
    budget.py     cost projection from the pruner's rung schedule; the budget check
    report.py     best configuration, trials table, importances, plots
    api.py        ``prudent.tune(...)``
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _TuneModule(types.ModuleType):
    """``prudent.tune(...)`` is the function of :mod:`prudent.tune.api`, and ``prudent.tune``
    is also this package once a submodule is imported: the package calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return importlib.import_module("prudent.tune.api").tune(*args, **kwargs)


sys.modules[__name__].__class__ = _TuneModule
