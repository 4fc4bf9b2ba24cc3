"""What a study will cost before it starts, and whether the next trial still fits the budget.

The projection comes from the pruner's rung schedule: successive halving lets ``1/rf`` of the
trials reaching a rung go on to the next, so a trial's expected epochs are known in advance
(assuming the pruner's survival rates hold; the median pruner's rate is unknown, so it is
projected as if nothing were pruned: an upper bound). Epoch time and price are measured or
given; the printout says which.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Projection", "expected_epochs", "next_trial_fits", "project"]


def _sha_expected(max_epochs: int, min_resource: int, rf: int, rate: int) -> float:
    """Expected epochs of one trial under successive halving starting at rung ``rate``."""
    expected, done, survive = 0.0, 0, 1.0
    rung = min_resource * rf ** rate
    while rung < max_epochs:
        expected += survive * (rung - done)
        done, survive, rung = rung, survive / rf, rung * rf
    return expected + survive * (max_epochs - done)


def _pruner_defaults() -> dict[str, Any]:
    """``make_pruner``'s own defaults, so the projection follows whatever strategy.py ships."""
    import inspect

    from prudent.tune.strategy import make_pruner

    return {name: p.default for name, p in inspect.signature(make_pruner).parameters.items()
            if name in ("min_resource", "reduction_factor")}


def expected_epochs(pruner: Mapping[str, Any], max_epochs: int) -> tuple[float, bool]:
    """(expected epochs of one trial, whether that is exact under the schedule or a bound)."""
    name = pruner.get("name", "none")
    args = {**_pruner_defaults(), **pruner.get("args", {})}
    r_min, rf = int(args["min_resource"]), int(args["reduction_factor"])
    if name == "asha":
        return _sha_expected(max_epochs, r_min, rf, 0), True
    if name == "hyperband":
        n = math.floor(math.log(max_epochs / r_min, rf)) + 1 if max_epochs > r_min else 1
        weights = [math.ceil(n * rf ** (n - 1 - b) / (n - b)) for b in range(n)]  # Optuna's
        total = sum(weights)
        return sum(w / total * _sha_expected(max_epochs, r_min, rf, b)
                   for b, w in enumerate(weights)), True
    return float(max_epochs), name == "none"


@dataclass(frozen=True)
class Projection:
    trials: int
    max_epochs: int | None
    epochs_per_trial: float | None
    exact: bool
    epoch_s: float | None
    epoch_s_source: str
    hourly_usd: float
    price_source: str
    workers: int
    unit: str = "epoch"  # or "step": what trials report and the pruner's resource counts

    @property
    def total_epochs(self) -> float | None:
        if self.epochs_per_trial is None:
            return None
        return self.trials * self.epochs_per_trial

    @property
    def usd(self) -> float | None:
        if self.total_epochs is None or self.epoch_s is None:
            return None
        return self.total_epochs * self.epoch_s * self.hourly_usd / 3600

    @property
    def trial_usd(self) -> float | None:
        return None if self.usd is None or not self.trials else self.usd / self.trials

    def lines(self) -> list[str]:
        unit = self.unit
        if self.epochs_per_trial is None:
            return [(f"projected: {self.trials} trials; {unit}s per trial unknown until one "
                     "completes (give --max-epochs or --max-steps for a projection now)")]
        bound = "" if self.exact else " at most"
        text = [(f"projected: {self.trials} trials x{bound} {self.epochs_per_trial:.1f} {unit}s "
                 f"(pruner schedule, max {self.max_epochs}) = {self.total_epochs:.0f} {unit}s")]
        if self.epoch_s is None:
            given = " (or give --epoch-s)" if unit == "epoch" else ""
            text.append(f"  time and cost: unknown until {_a(unit)} is measured{given}; "
                        f"price ${self.hourly_usd:.3f}/h per trial ({self.price_source})")
            return text
        hours = self.total_epochs * self.epoch_s / 3600  # type: ignore[operator]
        text.append(f"  at {self.epoch_s:.3g} s/{unit} ({self.epoch_s_source}): {hours:.3g} "
                    f"compute-hours, ~{hours / max(1, self.workers):.3g} h wall with "
                    f"{self.workers} worker(s)")
        text.append(f"  at ${self.hourly_usd:.3f}/h per trial ({self.price_source}):{bound} "
                    f"${self.usd:.4g} (each trial's run is metered separately)")
        return text


def project(*, trials: int, pruner: Mapping[str, Any], max_epochs: int | None,
            epoch_s: float | None, epoch_s_source: str, hourly_usd: float, price_source: str,
            workers: int, unit: str = "epoch") -> Projection:
    """The study's projection; with ``unit="step"``, ``max_epochs`` and ``epoch_s`` are a
    trial's steps and the seconds per step (the pruner's schedule is the same in any unit)."""
    per_trial, exact = (expected_epochs(pruner, max_epochs) if max_epochs else (None, False))
    return Projection(trials, max_epochs, per_trial, exact, epoch_s, epoch_s_source,
                      hourly_usd, price_source, workers, unit)


def _a(unit: str) -> str:
    return "an epoch" if unit == "epoch" else f"a {unit}"


def next_trial_fits(budget_usd: float | None, finished_usd: Iterable[float],
                    running_usd: Iterable[float], estimate_usd: float | None) -> tuple[bool, str]:
    """Whether one more trial fits: spent + what running trials will still cost + one more.

    A trial's expected cost is the mean of finished trials (pruned ones included), else the
    projection's estimate, else nothing is known and only the money already spent counts.
    """
    if budget_usd is None:
        return True, ""
    finished, running = list(finished_usd), list(running_usd)
    mean = sum(finished) / len(finished) if finished else (estimate_usd or 0.0)
    spent = sum(finished) + sum(running)
    committed = spent + sum(max(0.0, mean - r) for r in running) + mean
    if committed <= budget_usd and spent < budget_usd:
        return True, ""
    return False, (f"budget: ${spent:.2f} spent, ${committed:.2f} with the running trials and "
                   f"one more (~${mean:.2f} each) would pass --budget-usd {budget_usd:.2f}; "
                   "no new trial starts")
