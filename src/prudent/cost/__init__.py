"""Cost governance: a price catalog, a meter on every run, budgets, a policy, the bill."""

from __future__ import annotations

from prudent.cost.catalog import Catalog, InstanceType, load_catalog
from prudent.cost.meter import CostMeter
from prudent.cost.policy import (
           Job,
           PolicyViolation,
           Spend,
           Violation,
           check_job,
           load_policy,
)
from prudent.cost.settings import CostSettings, PolicySettings

__all__ = ["Catalog", "CostMeter", "CostSettings", "InstanceType", "Job", "PolicySettings",
           "PolicyViolation", "Spend", "Violation", "check_job", "load_catalog", "load_policy"]
