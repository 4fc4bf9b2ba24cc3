"""Rules on the numbers themselves: NaN/inf, gradients that blow up, gradients that vanish."""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Any

from pydantic import Field

from prudent.monitor.base import (
    ActionName,
    Finding,
    LayerSample,
    Rule,
    RuleSettings,
    Window,
    action_default,
    confirm_at,
    finite,
    fmt,
    warmup_default,
)
from prudent.monitor.tail import describe_tail, in_tail, new_outliers, note_outlier

__all__ = ["ExplodingGradientRule", "NonFiniteRule", "VanishingGradientRule"]


class NonFiniteSettings(RuleSettings):
    amp_patience: int = Field(20, ge=1, description="With a GradScaler attached, overflowing "
                              "gradients are normal (the scaler skips the step and lowers its "
                              "scale): fire only after this many in a row.")


class NonFiniteRule(Rule):
    """The loss or the global gradient norm is NaN or infinite (Keras' TerminateOnNaN checks
    only the loss; a NaN gradient poisons the weights one step before the loss shows it)."""

    name = "non_finite"
    needs = frozenset({"steps"})
    Settings = NonFiniteSettings
    settings: NonFiniteSettings
    state_fields = ("last_finite", "overflows")

    def __init__(self, settings: NonFiniteSettings | None = None) -> None:
        super().__init__(settings)
        self.last_finite: float | None = None
        self.overflows = 0

    def check(self, window: Window) -> Finding | None:
        if window.all_finite():  # the fast path, nearly every window
            finite = window.finite_losses()
            self.last_finite = finite[-1][1] if finite else self.last_finite
            if window.grad_norms():
                self.overflows = 0
            return None
        for step, loss, norm in zip(window.steps, window.loss, window.grad_norm):
            if not self.active_at(step):
                continue
            finding = self._check_loss(step, loss) or self._check_grad(step, norm, window.amp)
            if finding is not None:
                self.reset()
                return finding
        return None

    def _check_loss(self, step: int, loss: float | None) -> Finding | None:
        if loss is None:
            return None
        if math.isfinite(loss):
            self.last_finite = loss
            return None
        return Finding(step, loss, None, f"loss is {fmt(loss)} at step {step} "
                       f"(last finite {fmt(self.last_finite)})")

    def _check_grad(self, step: int, norm: float | None, amp: bool) -> Finding | None:
        if norm is None:
            return None
        if math.isfinite(norm):
            self.overflows = 0
            return None
        self.overflows += 1
        if amp and self.overflows < self.settings.amp_patience:
            return None
        streak = f", {self.overflows} steps in a row with a GradScaler" if amp else ""
        return Finding(step, norm, None, f"gradient norm is {fmt(norm)} at step {step}{streak} "
                       f"(last finite loss {fmt(self.last_finite)})")


class ExplodingGradientSettings(RuleSettings):
    action: list[ActionName] = action_default("skip", "stop")
    warmup_steps: int = warmup_default(50)
    factor: float = Field(10.0, gt=1, description="Fire when the gradient norm exceeds this "
                          "multiple of its median over the last `window` measured steps...")
    patience: int = Field(2, ge=1, description="...on this many steps in a row (a single hard "
                          "batch is not an explosion; a jump has the next step's norm measured).")
    window: int = Field(100, ge=5, description="Measured steps in the median baseline.")
    max_norm: float | None = Field(None, gt=0, description="Also fire at once above this "
                                   "absolute gradient norm (off by default).")
    max_skips: int = Field(4, ge=1, description="With action skip: a step whose norm is above "
                           "`factor` x the median of the norms before it has its optimizer "
                           "update skipped, at most this many per 128 steps; past that the "
                           "norms that get through are judged for the stop.")


class ExplodingGradientRule(Rule):
    """The global gradient norm rose far above its recent median and stayed there, while the
    loss stopped improving (a norm that grows while the loss reaches new lows is a model leaving
    its small initial weights: SGD with momentum at lr 0.1 does that on a healthy run).

    With action ``skip`` a single step whose norm is ``factor`` x above the median of the
    norms before it has its update skipped before ``optimizer.step()`` (OLMo, PaLM): the
    monitor asks :meth:`skips` on the steps whose norm it judges whatever the timing (the
    grid steps of :func:`~prudent.monitor.stats.on_grid`, and a step whose loss jumped), and
    the median is of the grid steps' norms alone, so which updates are skipped is the same in
    every run of the same training and in its resume."""

    name = "exploding_gradient"
    needs = frozenset({"steps"})
    judges_updates = True
    Settings = ExplodingGradientSettings
    settings: ExplodingGradientSettings
    state_fields = ("history", "above", "above_at", "loss_low", "reference", "losses", "skipped",
                    "outliers")

    def __init__(self, settings: ExplodingGradientSettings | None = None) -> None:
        super().__init__(settings)
        self.history: deque[float] = deque(maxlen=self.settings.window)
        self.above = 0
        self.above_at = -1  # the last step above the bar
        self.loss_low: float | None = None  # the lowest mean loss of a check's window
        self._improving = False
        self._ordered: list[float] = []  # history, sorted: a median without sorting each check
        # the skip's baseline: the last norms of grid steps, in step order (see skips)
        self.reference: deque[float] = deque(maxlen=_REFERENCE)
        self.losses: deque[float] = deque(maxlen=_REFERENCE)  # the same steps' losses
        self.skipped: deque[int] = deque(maxlen=self.settings.max_skips)
        self._sorted_reference: list[float] = []
        self.outliers = new_outliers()  # (step, norm) of each outlier met (prudent.monitor.tail)
        self.tail_step = -1  # the last step whose outlier was trained as the data's own tail
        # with no skip before the update (not an action, or not possible here: torchrun, a
        # GPU), the checks note the outliers instead, so that the data's tail still forms
        self.outliers_from_checks = "skip" not in self.settings.action

    def fit(self, planned_steps: int) -> str | None:
        self.sized(planned_steps, warmup_steps=min(50, planned_steps // 20))
        return None

    def check(self, window: Window) -> Finding | None:
        # the baseline is fixed per window: one median per check, not one per step
        baseline = _median(self._ordered) if len(self._ordered) >= 5 else None
        losses = window.finite_losses()
        self._improving = False
        if losses:
            mean = sum(v for _, v in losses) / len(losses)
            self._improving = self.loss_low is not None and mean < self.loss_low
            self.loss_low = mean if self.loss_low is None else min(self.loss_low, mean)
        repaired, tail = window.repaired, window.tail
        for step, norm in window.grad_norms():
            if not math.isfinite(norm) or step in repaired or step in tail:
                continue  # its update was skipped, or it is a known hard batch
            finding = self._judge(step, norm, baseline)
            if finding is not None:
                self.reset()
                return finding
            self._remember(norm)
        return None

    def _remember(self, norm: float) -> None:
        if len(self.history) == self.history.maxlen:
            del self._ordered[bisect.bisect_left(self._ordered, self.history[0])]
        self.history.append(norm)
        bisect.insort(self._ordered, norm)

    def reset(self) -> None:
        kept = self.reference, self.losses, self.skipped, self.outliers
        super().reset()
        self._ordered = []
        self.reference, self.losses, self.skipped, self.outliers = kept  # the skip's baseline

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._ordered = sorted(self.history)
        self._sorted_reference = sorted(self.reference)

    # per step, before the update ----------------------------------------------------------
    def skips(self, step: int, norm: float, grid: bool, judge: bool = True) -> float:
        """Before ``step``'s update: how many times its norm is above the median of the grid
        steps' norms before it, when that is more than ``factor`` and the budget of skips
        allows the skip (else 0; 0 too for one of the outliers the run keeps meeting: then
        ``tail_step`` is ``step``, see :mod:`prudent.monitor.tail`). ``grid``: a grid step,
        whose norm then joins the median. ``judge=False``: the step is trained whatever its
        norm (the loss's tail trained it): an outlier's norm is only remembered."""
        ratio = self._ratio(step, norm)
        if ratio and not judge:  # trained as the loss's tail: one of this tail too
            note_outlier(self.outliers, step, norm)
            ratio = 0.0
        elif ratio:
            trained = in_tail(self.outliers, step, norm, _SKIP_SPAN)
            note_outlier(self.outliers, step, norm)
            if trained:
                self.tail_step, ratio = step, 0.0
        if ratio and not self._take_skip(step):
            ratio = 0.0
        if grid and math.isfinite(norm):
            self._refer(norm)
        return ratio

    def note_loss(self, loss: Any) -> None:
        """A grid step's loss (a host number), for :meth:`loss_bar`."""
        if loss.__class__ is float and math.isfinite(loss):
            self.losses.append(loss)

    def loss_bar(self) -> float:
        """A loss above this (4x the mean of the grid steps' losses) has its step's norm
        judged too, whatever the stride: the first step of a burst, caught before its update."""
        losses = self.losses
        if len(losses) < 5:
            return math.inf
        mean = math.fsum(losses) / len(losses)
        return _LOSS_JUMP * mean if mean > 0 else math.inf

    def _ratio(self, step: int, norm: float) -> float:
        ordered = self._sorted_reference
        if len(ordered) < 5 or not math.isfinite(norm) or not self.active_at(step):
            return 0.0
        median = _median(ordered)
        return norm / median if median > 0 and norm > self.settings.factor * median else 0.0

    def _take_skip(self, step: int) -> bool:
        skipped = self.skipped
        if len(skipped) == skipped.maxlen and step - skipped[0] < _SKIP_SPAN:
            return False  # the budget is spent: the norms that get through are judged
        skipped.append(step)
        return True

    def _refer(self, norm: float) -> None:
        reference = self.reference
        if len(reference) == reference.maxlen:
            del self._sorted_reference[bisect.bisect_left(self._sorted_reference, reference[0])]
        reference.append(norm)
        bisect.insort(self._sorted_reference, norm)

    def describe_tail(self, step: int, norm: float) -> str:
        median = _median(self._sorted_reference) if self._sorted_reference else 0.0
        ratio = norm / median if median > 0 else math.inf
        return (f"gradient norm {fmt(norm)} at step {step} is {ratio:.3g}x its median "
                f"{fmt(median)}, but it is one of "
                + describe_tail(self.outliers, step, _SKIP_SPAN, "gradient norm"))

    def describe_skip(self, step: int, norm: float, ratio: float) -> str:
        recent = sum(1 for s in self.skipped if step - s < _SKIP_SPAN)
        return (f"gradient norm {fmt(norm)} at step {step} is {ratio:.3g}x its median "
                f"{fmt(norm / ratio)} over the last {len(self.reference)} judged steps "
                f"(threshold {self.settings.factor:g}x): its optimizer update was skipped "
                f"({recent} of at most {self.settings.max_skips} in {_SKIP_SPAN} steps)")

    def _judge(self, step: int, norm: float, baseline: float | None) -> Finding | None:
        s = self.settings
        if not self.active_at(step):
            return None
        if s.max_norm is not None and norm > s.max_norm:
            return Finding(step, norm, s.max_norm, f"gradient norm {fmt(norm)} at step {step} "
                           f"is above max_norm {fmt(s.max_norm)}")
        if not baseline or norm <= s.factor * baseline:
            self.above = 0
            return None
        if self.outliers_from_checks:  # (else the skips note them, on the steps they judge)
            trained = in_tail(self.outliers, step, norm, _SKIP_SPAN)
            note_outlier(self.outliers, step, norm)
            if trained:
                return None  # at the level of the hard batches the run keeps meeting
        elif self.outliers and in_tail(self.outliers, step, norm, _SKIP_SPAN):
            return None  # at the level of the hard batches the run keeps meeting: not counted
        # steps in a row, not measured steps: a jump has the next step measured (a burst
        # follows an explosion step by step), while hard batches a few steps apart, with
        # unmeasured steps between them, were two measured steps in a row near a loss floor
        self.above = self.above + 1 if step == self.above_at + 1 else 1
        self.above_at = step
        if self.above < s.patience or self._improving:  # learning: judged again next window
            return None
        return Finding(step, norm, s.factor * baseline, (
            f"gradient norm {fmt(norm)} at step {step} is {norm / baseline:.3g}x its median "
            f"{fmt(baseline)} over the last {len(self.history)} measured steps, "
            f"{self.above} steps in a row (threshold {s.factor:g}x)"))


_REFERENCE = 25  # grid steps' norms in the skip's median (every 32 steps: the last ~800)
_SKIP_SPAN = 128  # steps over which max_skips counts (loss_spike's window)
_LOSS_JUMP = 4.0  # a loss this many times the grid steps' mean has its norm judged


def _median(ordered: list[float]) -> float:
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class VanishingGradientSettings(RuleSettings):
    action: list[ActionName] = action_default("stop")
    min_rms: float = Field(1e-7, gt=0, description="Fire when a weight's gradient RMS is below "
                           "this (SageMaker's VanishingGradient threshold)...")
    min_ratio: float = Field(1e-6, gt=0, lt=1, description="...or below this fraction of the "
                             "largest layer's (scale-free: catches a deep stack that starves "
                             "its first layers, 1e-10 in a 12-layer sigmoid stack; a tiny "
                             "BERT's attention query and key weights get 1e-5 of its "
                             "classifier's while it learns, which 1e-4 stopped).")
    patience: int = Field(3, ge=1, description="Layer samples in a row (one every "
                          "monitor.sample_every_steps).")
    converged: float = Field(0.1, gt=0, lt=1, description="Not judged while the training loss "
                             "is below this fraction of its first value: the model has learnt "
                             "its task and small gradients are convergence (a tiny BERT that "
                             "solved its task, loss 0.69 -> 0.009, has key-weight gradients "
                             "of 3e-8), not a starved layer.")


class VanishingGradientRule(Rule):
    """Some weight matrices get (almost) no gradient, measured per layer every few steps.

    Exactly-zero gradients are skipped: an unused parameter or dead units are not vanishing
    (``dead_activations`` reports the latter). A run whose loss fell to a small fraction of
    its first value is not judged: its gradients vanish because it has learnt.
    """

    name = "vanishing_gradient"
    needs = frozenset({"layers"})
    Settings = VanishingGradientSettings
    settings: VanishingGradientSettings
    state_fields = ("count", "first_loss")

    def __init__(self, settings: VanishingGradientSettings | None = None) -> None:
        super().__init__(settings)
        self.count = 0
        self.first_loss: float | None = None  # median of the first window's finite losses
        self._due: int | None = None

    def check(self, window: Window) -> Finding | None:
        if self._converged(window):
            self.count = 0
            return None
        finding = self.first_finding(window.layers, self._judge)
        if window.layers:
            self._due = (confirm_at(window.layers[-1].step, window)
                         if finding is None and self.count else None)
        return finding

    def verdict_due(self, step: int) -> int | None:
        """A starved layer seen: the next samples, soon, confirm it (``confirm_gap``)."""
        return self._due

    def _converged(self, window: Window) -> bool:
        losses = sorted(v for _, v in window.finite_losses())
        if not losses:
            return False
        median = losses[len(losses) // 2]
        # where the run started (its first steps), not the first window this rule judged: a
        # model that memorises one batch is at 1e-5 by its first check of a long run
        start = window.start_loss if window.start_loss is not None else self.first_loss
        if start is None:
            self.first_loss = median
            return False
        return start > 0 and median < self.settings.converged * start

    def _judge(self, sample: LayerSample) -> Finding | None:
        rms = {k: v for k, v in sample.grad_rms.items() if finite(v) and v > 0}
        if not rms or not self.active_at(sample.step):
            return None
        low_name, low = min(rms.items(), key=lambda kv: kv[1])
        high_name, high = max(rms.items(), key=lambda kv: kv[1])
        s = self.settings
        relative = low / high if len(rms) > 1 else 1.0
        if low >= s.min_rms and relative >= s.min_ratio:
            self.count = 0
            return None
        self.count += 1
        if self.count < s.patience:
            return None
        return Finding(sample.step, low, s.min_rms, (
            f"gradients vanish in {low_name}: RMS {low:.2g} at step {sample.step}, "
            f"{relative:.1g} of the largest ({high_name}, {high:.2g}); thresholds "
            f"{s.min_rms:g} absolute or {s.min_ratio:g} relative, {self.count} samples in a row"))
