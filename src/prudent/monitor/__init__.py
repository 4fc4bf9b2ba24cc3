"""Automated monitoring: rules that watch every step and act when training goes wrong.

::

    base.py        Window (what a rule sees), Finding (what it says), Rule, RuleSettings
    registry.py    rules by name: register_rule (a class), @rule (a function)
    rules/         the built-in rules, one module per family
    settings.py    MonitorSettings: ``monitor:`` in prudent.yaml
    stats.py       StepStats: statistics kept on the device, read a window at a time
    activations.py ActivationProbe: forward hooks on sampled steps only
    actions.py     stop, reduce_lr, alert, capture, prune
    webhook.py     WebhookSender: alerts POSTed as JSON from a background thread
    watchdog.py    StallWatchdog: the clock behind the ``stalled`` rule
    monitor.py     Monitor: the component wiring them to the run's events
"""

from __future__ import annotations

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

from prudent.monitor.base import Finding, Rule, RuleSettings, Window
from prudent.monitor.monitor import Monitor
from prudent.monitor.registry import register_rule, rule, unregister_rule
from prudent.monitor.settings import MonitorSettings
