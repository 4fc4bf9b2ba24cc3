"""Preemption: the cloud's interruption notice turned into a clean, resumable stop.

::

    settings.py   PreemptionSettings: ``preemption:`` in prudent.yaml
    cloud.py      detect_cloud: which cloud, from DMI
    watcher.py    PreemptionWatcher: polls the notice, asks for a stop with the deadline
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = ["PreemptionSettings", "PreemptionWatcher", "detect_cloud"]

__getattr__ = lazy_exports(__name__, {
    "PreemptionSettings": "prudent.preemption.settings",
    "PreemptionWatcher": "prudent.preemption.watcher",
    "detect_cloud": "prudent.preemption.cloud",
})
