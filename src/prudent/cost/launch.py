"""The check ``prudent run`` makes before it launches anything: instance known, policy kept.

It reads the store only if one exists already, so a refused job leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from prudent.cost.shape import torchrun_environ, with_torchrun

if TYPE_CHECKING:
    from prudent.wiring.config import ProjectSettings

__all__ = ["check_launch", "existing_spend"]


def check_launch(settings: ProjectSettings, kind: str = "run", parallel: int = 1,
                 command: Sequence[str] = ()) -> Job:
    """The job the settings describe; ConfigError on bad input, PolicyViolation if refused.

    A torchrun ``command`` sizes the job as its workers will see it (machines from
    ``--nnodes``, one GPU per process on GPU instances), as the meter will."""
    catalog = load_catalog(settings.cost)
    cost, _ = with_detected(settings.cost, settings.preemption, catalog)
    job = job_from_settings(cost, catalog, kind=kind, parallel=parallel)
    job, _ = with_torchrun(job, cost, torchrun_environ(command),
                           on_gpu=lambda: bool(job.instance and job.instance.num_gpus))
    policy = load_policy(settings)
    broken = check_job(policy, job, existing_spend(settings), catalog)
    if broken:
        raise PolicyViolation("refused by policy: " + "; ".join(
            f"[{v.rule}] {v.message}" for v in broken))
    return job


def existing_spend(settings: ProjectSettings) -> Spend:
    """Today's and this month's stored costs, without creating a store that is not there."""
    from prudent.store.database import Store

    store_settings = settings.store
    if store_settings.url is None and not (Path(store_settings.home) / "prudent.db").exists():
        return Spend()
    store = Store.open(store_settings)
    try:
        return project_spend(store)
    finally:
        store.close()
