"""Automated monitoring: rules that watch every step and act when training goes wrong.

::

    base.py        Window (what a rule sees), Finding (what it says), Rule, RuleSettings
    registry.py    rules by name: register_rule (a class), @rule (a function)
    rules/         the built-in rules, one module per family
    settings.py    MonitorSettings: ``monitor:`` in prudent.yaml
    stats.py       StepStats: statistics kept on the device, read a window at a time
    shards.py      ShardedNorms: FSDP2's sharded (DTensor) norms made global, steps agreed
    memory.py      memory_sample: host and device memory at one step
    activations.py ActivationProbe: forward hooks on sampled steps only
    actions.py     stop, reduce_lr, alert, capture, prune
    webhook.py     WebhookSender: alerts POSTed as JSON from a background thread
    watchdog.py    StallWatchdog: the clock behind the ``stalled`` rule
    stall_stacks.py RankStacks: a stall's stacks, per rank under torchrun, the hung rank named
    monitor.py     Monitor: the component wiring them to the run's events
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = [
    "Finding",
    "Monitor",
    "MonitorSettings",
    "Rule",
    "RuleSettings",
    "Window",
    "register_rule",
    "rule",
    "unregister_rule",
]

_EXPORTS = {
    "Finding": "prudent.monitor.base",
    "Monitor": "prudent.monitor.monitor",
    "MonitorSettings": "prudent.monitor.settings",
    "Rule": "prudent.monitor.base",
    "RuleSettings": "prudent.monitor.base",
    "Window": "prudent.monitor.base",
    "register_rule": "prudent.monitor.registry",
    "rule": "prudent.monitor.registry",
    "unregister_rule": "prudent.monitor.registry",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
