"""``prudent preflight``: run the user's real script on a tiny budget and judge it.

``probe`` watches a smoke process from inside (a component, smoke mode only; ``overfit``
rewinds the generators of a loop that draws its own batches); ``runner`` launches the smoke,
overfit and resume processes; ``checks`` turns what they recorded into the checklist (with
``batch_check`` and ``resume_check``; ``result`` is what every check returns); ``projection``
estimates the full run's time and cost; ``report`` prints it.
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = ["PreflightProbe", "ProbeSettings"]

_EXPORTS = {
    "PreflightProbe": "prudent.preflight.probe",
    "ProbeSettings": "prudent.preflight.probe",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
