"""Synthetic statistics for rule tests: a healthy run, and the same run made sick one way.

A stream is a list of :class:`Window` s of 10 steps, as the monitor hands them to rules. The
healthy one has what real training has: a noisy, decreasing loss with warm-up spikes, noisy
gradient norms, layer and activation samples every 50 steps, memory that wobbles, and an
evaluation every 200 steps; each sickness changes one thing from step ``ONSET`` on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from prudent.monitor.base import (
    ActivationSample,
    EvalSample,
    LayerSample,
    MemorySample,
    Window,
)

ONSET = 600
STEPS = 3000
_MB = 1 << 20


class Run:
    """The numbers of one synthetic run, step by step; ``sick`` replaces one of them from
    step ONSET on: ``(what, make)`` with ``make(step, healthy value) -> sick value``."""

    def __init__(self, sick: tuple[str, Callable[[int, Any], Any]] | None = None,
                 seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.sick = sick

    def value(self, what: str, step: int) -> Any:
        healthy = getattr(self, what)(step)
        if self.sick is not None and self.sick[0] == what and step >= ONSET:
            return self.sick[1](step, healthy)
        return healthy

    def loss(self, step: int) -> float:
        spike = 4.0 if step in (7, 8, 30, 61) else 1.0  # warm-up spikes
        return (2.0 * math.exp(-step / 400) + 0.4) * spike * self.rng.uniform(0.6, 1.4)

    def grad_norm(self, step: int) -> float:
        spike = 6.0 if step % 97 == 0 else 1.0  # a hard batch now and then
        return self.rng.uniform(0.5, 1.5) * spike

    def layers(self, step: int) -> LayerSample:
        rms = {"0.weight": self.rng.uniform(5e-4, 2e-3), "2.weight": self.rng.uniform(1e-3, 4e-3)}
        return LayerSample(step, rms, self.rng.uniform(5e-4, 3e-3), {"0.weight": 1e-3})

    def activations(self, step: int) -> ActivationSample:
        return ActivationSample(step, {"1": self.rng.uniform(0.0, 0.3)}, {"1": "dead"})

    def memory(self, step: int) -> MemorySample:
        return MemorySample(step, 500 * _MB + self.rng.randint(-4, 4) * _MB, None)

    def val_loss(self, step: int) -> float:
        return 2.0 * math.exp(-step / 500) + 0.6 + self.rng.uniform(-0.01, 0.01)


def stream(run: Run | None = None, steps: int = STEPS, every: int = 10) -> list[Window]:
    run = run or Run()
    windows, train = [], []
    for first in range(1, steps + 1, every):
        window = Window(lr=1e-3, peak_lr=1e-3)
        for step in range(first, first + every):
            window.steps.append(step)
            window.loss.append(run.value("loss", step))
            window.grad_norm.append(run.value("grad_norm", step))
            train.append(window.loss[-1])
            if step % 50 == 0:
                window.layers.append(run.value("layers", step))
                window.activations.append(run.value("activations", step))
                window.memory.append(run.value("memory", step))
            if step % 200 == 0:
                mean = sum(train) / len(train)
                window.evals.append(EvalSample(step, {"val_loss": run.value("val_loss", step)},
                                               mean))
                train = []
        windows.append(window)
    return windows


SICK: dict[str, tuple[str, Callable[[int, Any], Any]]] = {
    "non_finite": ("loss", lambda step, v: float("nan")),
    "exploding_gradient": ("grad_norm", lambda step, v: v * 1.5 ** min(step - ONSET, 200)),
    "vanishing_gradient": ("layers", lambda step, v: LayerSample(
        step, {**v.grad_rms, "0.weight": 1e-12}, v.update_ratio)),
    "loss_not_decreasing": ("loss", lambda step, v: 2.3 * random.Random(step).uniform(0.8, 1.2)),
    "divergence": ("loss", lambda step, v: v * (1 + (step - ONSET) / 40)),
    "overfitting": ("val_loss", lambda step, v: 0.9 + (step - ONSET) / 1000),
    "early_stopping": ("val_loss", lambda step, v: 0.9 + (step - ONSET) / 1000),
    "loss_spike": ("loss", lambda step, v: v * 5 if step < ONSET + 40 else v),
    "update_ratio": ("layers", lambda step, v: LayerSample(step, v.grad_rms, 1e-9)),
    "dead_activations": ("activations", lambda step, v: ActivationSample(
        step, {"1": 0.95}, {"1": "dead"})),
    "memory_growth": ("memory", lambda step, v: MemorySample(
        step, 500 * _MB + (step - ONSET) * _MB, None)),
}


def sick_stream(rule: str, steps: int = STEPS) -> list[Window]:
    return stream(Run(SICK[rule]), steps)
