"""The check ``prudent run`` makes before it launches anything: instance known, policy kept.

It reads the store only if one exists already, so a refused job leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prudent.cost.catalog import load_catalog
from prudent.cost.detect import with_detected
from prudent.cost.policy import (
    Job,
    PolicyViolation,
    Spend,
    check_job,
    job_from_settings,
    load_policy,
    project_spend,
)

if TYPE_CHECKING:
    from prudent.config import ProjectSettings

__all__ = ["check_launch", "existing_spend"]


def check_launch(settings: ProjectSettings, kind: str = "run", parallel: int = 1) -> Job:
    """The job the settings describe; ConfigError on bad input, PolicyViolation if refused."""
    catalog = load_catalog(settings.cost)
    cost, _ = with_detected(settings.cost, settings.preemption, catalog)
    job = job_from_settings(cost, catalog, kind=kind, parallel=parallel)
    policy = load_policy(settings)
    broken = check_job(policy, job, existing_spend(settings), catalog)
    if broken:
        raise PolicyViolation("refused by policy: " + "; ".join(
            f"[{v.rule}] {v.message}" for v in broken))
    return job


def existing_spend(settings: ProjectSettings) -> Spend:
    """Today's and this month's stored costs, without creating a store that is not there."""
    from prudent.store import Store

    store_settings = settings.store
    if store_settings.url is None and not (Path(store_settings.home) / "prudent.db").exists():
        return Spend()
    store = Store.open(store_settings)
    try:
        return project_spend(store)
    finally:
        store.close()
