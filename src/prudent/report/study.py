"""A tuning study's page: ``prudent study --json``'s summary plus what its charts need.

The summary (trials, who pruned each, costs, Optuna's parameter importances) is
:func:`prudent.tune.report.summarize`, unchanged; this adds each trial's intermediate values
(the curves pruning decided on) and the studies a store folder holds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prudent.kernel.errors import ConfigError

if TYPE_CHECKING:
    from prudent.wiring.config import ProjectSettings

__all__ = ["list_studies", "study_page"]


def list_studies(home: str | Path, storage: Any = None) -> list[str]:
    """Names of the studies kept as journal files under ``<home>/studies``, and those in an
    opened Optuna ``storage`` (a database shared by machines: ``prudent ui --storage``)."""
    folder = Path(home).resolve() / "studies"
    names = {p.stem for p in folder.glob("*.journal")} if folder.is_dir() else set()
    if storage is not None:
        from prudent.tune.study import import_optuna

        names.update(import_optuna().get_all_study_names(storage))
    return sorted(names)


def study_page(settings: ProjectSettings, name: str, storage: str | None = None,
               opened: Any = None) -> dict[str, Any]:
    """The study's summary, trials' intermediate values and parameter columns. ``storage``: a
    URL; ``opened``: an Optuna storage already open (the dashboard keeps one), tried when the
    study has no journal file."""
    from prudent.tune.report import summarize
    from prudent.tune.study import load, open_storage, storage_url, validate_study_name

    validate_study_name(name)
    url = storage_url(settings.store.home, name, storage)
    journal = storage is None and Path(url).exists()
    if storage is None and not journal and opened is None:
        raise ConfigError(f"no study {name!r}: {url} does not exist; start one with prudent "
                          f"tune --study {name} --space ... -- python train.py")
    study = load(name, opened if storage is None and not journal else open_storage(url))
    summary = summarize(study, settings)
    curves = {t.number: sorted((int(k), _finite(v)) for k, v in t.intermediate_values.items())
              for t in study.get_trials(deepcopy=False)}
    for trial in summary["trials"]:
        points = curves.get(trial["number"], [])
        trial["intermediate"] = {"steps": [p[0] for p in points], "values": [p[1] for p in points]}
        trial["value"] = _finite(trial["value"])
    return {"page": "study", "summary": summary, "params": _param_names(summary["trials"])}


def _param_names(trials: list[dict[str, Any]]) -> list[str]:
    return sorted({k for t in trials for k in t["params"]})


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
