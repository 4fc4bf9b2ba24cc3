"""The built-in rules, registered by name on import (in this order, which is the order
rules are asked and ties between findings of the same step are reported).

::

    numeric.py    non_finite, exploding_gradient, vanishing_gradient
    spikes.py     loss_spike
    progress.py   loss_not_decreasing, divergence, overfitting
    validation.py early_stopping
    internals.py  update_ratio, dead_activations
    system.py     memory_growth, stalled (the clock side lives in ``watchdog.py``)
"""

from __future__ import annotations

from prudent.monitor.registry import register_rule
from prudent.monitor.rules.internals import DeadActivationsRule, UpdateRatioRule
from prudent.monitor.rules.numeric import (
    ExplodingGradientRule,
    NonFiniteRule,
    VanishingGradientRule,
)
from prudent.monitor.rules.progress import (
    DivergenceRule,
    LossNotDecreasingRule,
    OverfittingRule,
)
from prudent.monitor.rules.spikes import LossSpikeRule
from prudent.monitor.rules.system import MemoryGrowthRule, StalledRule
from prudent.monitor.rules.validation import EarlyStoppingRule

__all__ = ["BUILTIN_RULES", "DeadActivationsRule", "DivergenceRule", "EarlyStoppingRule",
           "ExplodingGradientRule", "LossNotDecreasingRule", "LossSpikeRule", "MemoryGrowthRule",
           "NonFiniteRule", "OverfittingRule", "StalledRule", "UpdateRatioRule",
           "VanishingGradientRule"]

BUILTIN_RULES = (NonFiniteRule, LossSpikeRule, ExplodingGradientRule, VanishingGradientRule,
                 LossNotDecreasingRule, DivergenceRule, OverfittingRule, EarlyStoppingRule,
                 UpdateRatioRule, DeadActivationsRule, StalledRule, MemoryGrowthRule)

for _rule in BUILTIN_RULES:
    register_rule(_rule)
