"""Early stopping on a validation metric, with Keras' and Lightning's semantics."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from prudent.monitor.base import (
    EvalSample,
    Finding,
    Rule,
    RuleSettings,
    Window,
    finite,
    fmt,
    validation_metric,
)

__all__ = ["EarlyStoppingRule", "higher_is_better"]

_HIGHER_IS_BETTER = ("acc", "auc", "f1", "precision", "recall", "score", "map", "iou", "bleu")


def higher_is_better(metric: str) -> bool:
    """``mode: auto``: max for accuracies, AUC, F1, precision, recall, scores, mAP, IoU, BLEU."""
    name = metric.lower()
    return any(word in name for word in _HIGHER_IS_BETTER)


class EarlyStoppingSettings(RuleSettings):
    cooldown_steps: int = Field(0, ge=0, description="After firing, the rule stays silent for "
                                "this many steps (matters for actions that do not stop).")
    metric: str | None = Field(None, description="The run.log metric watched; default: the "
                               "first val_* metric the script logs (val_loss, val_acc, ...), "
                               "else eval_loss (the Hugging Face Trainer's).")
    mode: Literal["auto", "min", "max"] = Field("auto", description="Whether lower or higher is "
                                                "better; auto: max for names with acc, auc, f1, "
                                                "precision, recall, score, map, iou, bleu.")
    min_delta: float = Field(0.0, ge=0, description="The smallest change that counts as an "
                             "improvement, in the metric's units (Keras, Lightning: 0).")
    patience: int = Field(5, ge=1, description="Evaluations in a row without improvement before "
                          "the rule fires (Lightning: 3, Keras: 0; 5 lets a plateau of four "
                          "noisy evaluations pass).")
    baseline: float | None = Field(None, description="A value the metric must beat: until it "
                                   "does, every evaluation counts as one without improvement.")
    no_progress_patience: int = Field(2, ge=1, description="Fewer evaluations of patience "
                                      "while nothing has been learned: the metric never beat "
                                      "its first evaluation and the training loss is still "
                                      "within no_progress_train of where it was then (a "
                                      "classifier on random labels): validation and "
                                      "training agree, so fewer than Lightning's 3 checks.")
    no_progress_train: float = Field(0.1, gt=0, le=1, description="How far the training loss "
                                     "must fall below its value at the first evaluation, "
                                     "relative (0.1 = 10%, loss_not_decreasing's max_progress), "
                                     "before a run counts as learning something.")
    still_train: float = Field(0.05, ge=0, le=1, description="The first evaluation without "
                               "improvement is enough (Keras' default patience) when, besides "
                               "the metric never beating its first evaluation, the training "
                               "loss moved less than this since then, relative, with twice "
                               "the two means' standard errors to spare (random labels: "
                               "1.3%; the healthy runs that learn slowest fall 10% between "
                               "their first two evaluations), over at least a twentieth of the "
                               "planned run (an evaluation per epoch of a 20-epoch run; closer "
                               "evaluations wait for no_progress_patience). 0: never.")
    restore_best: bool = Field(True, description="Keep the best evaluation's checkpoint (never "
                               "rotated out) and, when this rule stops the run, put its weights "
                               "back: the final weights are the best ones.")


class EarlyStoppingRule(Rule):
    """No improvement of a validation metric for ``patience`` evaluations (Keras' and
    Lightning's ``EarlyStopping``: ``patience`` counts evaluations, i.e. ``run.log`` calls that
    carry the metric, not epochs).

    A run that has learned nothing needs less patience: when the metric never beat its first
    evaluation and the training loss is still within ``no_progress_train`` of its value then,
    it fires after ``no_progress_patience`` evaluations (patience exists to let a noisy plateau
    *after progress* pass; a saddle still improves its validation a little at each evaluation),
    and after one when the training loss has not moved at all (``still_train``) over a
    twentieth of the run.

    ``best_step`` is the step of the best evaluation so far and ``improved`` says whether the
    last window brought a new best: the monitor keeps that evaluation's checkpoint for
    ``restore_best``.
    """

    name = "early_stopping"
    needs = frozenset({"evals"})
    Settings = EarlyStoppingSettings
    settings: EarlyStoppingSettings
    state_fields = ("metric", "best", "best_step", "waited", "num_evals", "first_step",
                    "first_train", "first_train_se", "start", "too_early")

    def __init__(self, settings: EarlyStoppingSettings | None = None) -> None:
        super().__init__(settings)
        self.metric: str | None = self.settings.metric
        self.best: float | None = None  # sign x value: lower is better
        self.best_step: int | None = None
        self.waited = 0
        self.num_evals = 0
        self.first_step: int | None = None  # the first evaluation, and the training loss then
        self.first_train: float | None = None
        self.first_train_se: float | None = None  # the standard error of that mean
        self.improved = False
        self.judged = False  # saw the metric at least once (kept when the rule starts over)
        self.planned: int | None = None  # the run's planned steps (fit)
        self.start: float | None = None  # where the run's training loss started (Window)
        self.too_early: list[int] = []  # steps of evaluations logged before the rule starts

    def fit(self, planned_steps: int) -> str | None:
        self.planned = planned_steps
        return None

    def sign(self, metric: str) -> float:
        mode = self.settings.mode
        if mode == "auto":
            mode = "max" if higher_is_better(metric) else "min"
        return -1.0 if mode == "max" else 1.0

    def check(self, window: Window) -> Finding | None:
        self.improved = False
        if window.start_loss is not None:
            self.start = window.start_loss
        for sample in window.evals:
            finding = self._judge(sample)
            if finding is not None:
                self.reset()  # with an action that does not stop, it counts anew
                return finding
        return None

    def _judge(self, sample: EvalSample) -> Finding | None:
        if self.metric is None:
            self.metric = validation_metric(sample.metrics)
        value = sample.metrics.get(self.metric) if self.metric else None
        if not finite(value):
            return None
        if not self.active_at(sample.step):
            if len(self.too_early) < 4:  # enough to name them
                self.too_early.append(sample.step)
            return None
        s, metric = self.settings, self.metric
        assert metric is not None and value is not None
        score = self.sign(metric) * value
        self.num_evals += 1
        self.judged = True
        if self.first_step is None:
            self.first_step, self.first_train = sample.step, sample.train_loss
            self.first_train_se = sample.train_loss_se
        reference = self.best
        if s.baseline is not None:
            reference = min(reference if reference is not None else float("inf"),
                            self.sign(metric) * s.baseline)
        if reference is None or score + s.min_delta < reference:
            self.best, self.best_step, self.waited, self.improved = score, sample.step, 0, True
            return None
        if self.best is None or score < self.best:  # beats the best so far, not the baseline
            self.best, self.best_step, self.improved = score, sample.step, True
        self.waited += 1
        if self.waited >= s.patience:  # progress, then none for `patience`: the training is done
            return Finding(sample.step, value, self._target(metric), self._message(sample, value),
                           finished=True)
        patience = 1 if self._still(sample) else s.no_progress_patience
        if self.waited >= patience and self._nothing_learned(sample):
            return Finding(sample.step, value, self._target(metric),
                           self._message(sample, value) + self._no_progress_message(sample))
        return None

    def _still(self, sample: EvalSample) -> bool:
        """The training loss has not moved (``still_train``) over at least a twentieth of the
        planned run since the first evaluation: with the metric at its first value, one more
        evaluation adds nothing but steps. Not moved means that even with twice the noise of
        the two means (their standard errors) the move stays under ``still_train``: means of a
        few noisy steps that fell 4% (a healthy run's first two epochs of 12 steps, its
        accuracy still at the majority class) are no evidence of standing still."""
        first, now, s = self.first_train, sample.train_loss, self.settings
        if (not s.still_train or not self.planned or self.first_step is None
                or not finite(first) or not finite(now)):
            return False
        if sample.step - self.first_step < self.planned / 20:
            return False
        noise = 2 * math.hypot(self.first_train_se or 0.0, sample.train_loss_se or 0.0)
        return abs(now - first) + noise < s.still_train * abs(first)  # type: ignore[operator]

    def _nothing_learned(self, sample: EvalSample) -> bool:
        """The best is still the first evaluation and the training loss has not fallen
        ``no_progress_train`` below what it was then: neither signal shows learning, so the
        patience that lets a noisy plateau *after progress* pass is not needed (a healthy net
        in a saddle still lowers its validation loss a little at every evaluation)."""
        first, now, start = self.first_train, sample.train_loss, self.start
        if self.best_step != self.first_step or not finite(first) or not finite(now):
            return False
        fell = self.settings.no_progress_train
        if finite(start) and now < start - fell * abs(start):  # type: ignore[operator]
            return False  # learned before its first evaluation (a bigram table within 5 steps)
        return now > first - fell * abs(first)  # type: ignore[operator]

    def _no_progress_message(self, sample: EvalSample) -> str:
        s = self.settings
        if self._still(sample):
            return (f", its first evaluation, while the training loss {fmt(sample.train_loss)} "
                    f"moved less than {s.still_train:.0%} from its {fmt(self.first_train)} "
                    f"then: nothing is being learned (patience 1 evaluation, not {s.patience})")
        return (f", its first evaluation, while the training loss {fmt(sample.train_loss)} is "
                f"still within {s.no_progress_train:.0%} of its "
                f"{fmt(self.first_train)} then: nothing is being learned (patience "
                f"{s.no_progress_patience} evaluations, not {s.patience})")

    def _target(self, metric: str) -> float | None:
        if self.best is None:
            return self.settings.baseline
        return self.sign(metric) * (self.best - self.settings.min_delta)

    def _message(self, sample: EvalSample, value: float) -> str:
        metric, s = self.metric, self.settings
        best = fmt(self.sign(metric) * self.best) if self.best is not None else "none"  # type: ignore[arg-type]
        times = f"{self.waited} evaluation{'s' if self.waited != 1 else ''}"
        text = (f"early stopping: {metric} has not improved for {times}: "
                f"{fmt(value)} at step {sample.step}, best {best} at step {self.best_step}")
        if s.min_delta:
            text += f" (min_delta {s.min_delta:g})"
        if s.baseline is not None:
            text += f" (baseline {s.baseline:g})"
        return text

    def blind_reason(self) -> str | None:
        """Said once at the end of a run whose evaluations it never judged: the metric was
        missing, or logged only before the rule starts (nanoGPT evaluates at step 0)."""
        if self.judged or self.num_evals:
            return None
        if self.too_early:
            steps = ", ".join(str(step) for step in self.too_early[:3])
            more = ", ..." if len(self.too_early) > 3 else ""
            return (f"early_stopping judged no evaluation: {self.metric} was logged only at "
                    f"step {steps}{more}, before any training or within its warmup_steps "
                    f"({self.settings.warmup_steps}); a later evaluation is judged")
        watched = self.settings.metric or "a val_* metric (or eval_loss)"
        return (f"early_stopping could not judge: the run never logged {watched} with "
                "run.log (set monitor.rules.early_stopping.metric to the metric to watch)")
