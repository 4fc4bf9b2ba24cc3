"""Cost governance: a price catalog, a meter on every run, budgets, a policy, the bill."""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = ["Catalog", "CostMeter", "CostSettings", "InstanceType", "Job", "PolicySettings",
           "PolicyViolation", "Spend", "Violation", "check_job", "load_catalog", "load_policy"]

_EXPORTS = {
    "Catalog": "prudent.cost.catalog",
    "CostMeter": "prudent.cost.meter",
    "CostSettings": "prudent.cost.settings",
    "InstanceType": "prudent.cost.catalog",
    "Job": "prudent.cost.policy",
    "PolicySettings": "prudent.cost.settings",
    "PolicyViolation": "prudent.cost.policy",
    "Spend": "prudent.cost.policy",
    "Violation": "prudent.cost.policy",
    "check_job": "prudent.cost.policy",
    "load_catalog": "prudent.cost.catalog",
    "load_policy": "prudent.cost.policy",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
