"""Rules on learning progress: a flat loss, a loss that climbs back, validation that worsens."""

from __future__ import annotations

import math
import operator
from collections import deque
from typing import Literal

from pydantic import Field

from prudent.monitor.base import (
    LR_FRACTION_HELP,
    EvalSample,
    Finding,
    Rule,
    RuleSettings,
    Window,
    finite,
    fmt,
    validation_metric,
    warmup_default,
)

__all__ = ["DivergenceRule", "LossNotDecreasingRule", "OverfittingRule"]

class LossNotDecreasingSettings(RuleSettings):
    warmup_steps: int = warmup_default(100)
    window: int = Field(200, ge=1, description="Steps averaged into one block mean (averaging "
                        "over many mini-batches is what makes the comparison meaningful).")
    patience: int = Field(5, ge=1, description="Fire after this many blocks in a row without "
                          "improving on the best block mean.")
    min_improvement: float = Field(0.01, ge=0, lt=1, description="Relative improvement over the "
                                   "best block mean that counts as progress (0.01 = 1%).")
    min_lr_fraction: float = Field(0.2, ge=0, le=1, description=LR_FRACTION_HELP)
    new_level: float = Field(0.05, gt=0, description="A block mean this fraction above the best "
                             "starts a new level (new data at an epoch boundary, a restarted "
                             "schedule): progress is then judged from there (a loss that climbs "
                             "for good is divergence's business).")
    max_progress: float = Field(0.1, gt=0, le=1, description="Only a loss still within this "
                                "fraction of where it started (the median of the run's first "
                                "5 losses, else of its first block) "
                                "is stuck: one that fell further and then flattened has "
                                "converged, which is success (0.1 = 10%; 1: judge every "
                                "plateau).")


class LossNotDecreasingRule(Rule):
    """No relative improvement of the mean training loss over ``patience`` blocks of
    ``window`` steps (SageMaker's LossNotDecreasing compares single steps 10 apart, which the
    noise of mini-batches makes a coin toss)."""

    name = "loss_not_decreasing"
    needs = frozenset({"steps"})
    Settings = LossNotDecreasingSettings
    settings: LossNotDecreasingSettings
    state_fields = ("block_sum", "block_count", "best", "best_step", "waited", "first",
                    "first_values", "block_sq", "previous", "block", "seen", "start")

    def __init__(self, settings: LossNotDecreasingSettings | None = None) -> None:
        super().__init__(settings)
        self.block_sum = 0.0
        self.block_count = 0
        self.block_sq = 0.0  # squared step-to-step differences in the block: its noise
        self.previous: float | None = None  # the block's last loss
        self.block: int | None = None  # the block length once noise made it longer
        self.best: float | None = None
        self.best_step = 0
        self.waited = 0
        self.first: float | None = None  # the median loss of the first block: where it started
        self.first_values: list[float] = []
        self.seen = 0  # the last step judged
        self.start: float | None = None  # where the run's loss started (Window.start_loss)

    def fit(self, planned_steps: int) -> str | None:
        # a short warm-up: the blocks are means (an initial drop only makes the first block
        # the one to beat) and the patience below is what guards a saddle, not the warm-up
        warmup = min(100, planned_steps // 200)
        room = planned_steps // 10 - warmup  # a verdict within about a tenth of the run
        # the verdict early in the run, with blocks of at least MIN_BLOCK steps; a block whose
        # mean is too noisy to compare at min_improvement grows (see _close_block)
        window = max(MIN_BLOCK, min(200, room // 6))
        given = getattr(self, "_given", None) or self.settings
        block = given.window if "window" in given.model_fields_set else window
        # 5 blocks of patience where they fit, fewer on a shorter run, but the loss must stay
        # flat for FLAT_STEPS after its best block whatever the blocks' length: longer than
        # the saddle a healthy net starting near zero sits in (healthy_plateau escapes it at
        # 265-365 steps on 3 seeds). A converged plateau is not judged at all (max_progress)
        self.sized(planned_steps, warmup_steps=warmup, window=window,
                   patience=max(-(-FLAT_STEPS // block), min(5, room // block - 1)))
        s = self.settings
        needed = s.warmup_steps + (s.patience + 1) * s.window
        if needed > planned_steps:
            return (f"loss_not_decreasing cannot judge this run: it needs {needed} steps "
                    f"(warm-up {s.warmup_steps} + {s.patience + 1} blocks of {s.window}) and the "
                    f"run plans {planned_steps}")
        return None

    @property
    def window(self) -> int:
        """Steps per block: the setting, or longer where the loss is noisier (``_close_block``)."""
        return self.block or self.settings.window

    @property
    def patience(self) -> int:
        """Blocks of patience: as many of a grown block as span the blocks set."""
        s = self.settings
        return -(-s.patience * s.window // self.window)

    def check(self, window: Window) -> Finding | None:
        tail = window.in_schedule_tail(self.settings.min_lr_fraction)
        losses = window.finite_losses()
        warmup = self.settings.warmup_steps
        start = 0
        if losses and losses[0][0] <= warmup:
            start = next((i for i, (step, _) in enumerate(losses) if step > warmup), len(losses))
        if losses:
            self.seen = losses[-1][0]
        if window.start_loss is not None:
            self.start = window.start_loss
        while start < len(losses):  # a block's worth at a time: sums at C speed
            chunk = losses[start:start + self.window - self.block_count]
            values = list(map(_second, chunk))
            if self.first is None:
                self.first_values.extend(values)
            self.block_sum = sum(values, self.block_sum)
            self.block_sq = sum(map(_squared_step, values, [self.previous, *values]),
                                self.block_sq)
            self.previous = values[-1]
            self.block_count += len(chunk)
            start += len(chunk)
            if self.block_count == self.window:
                finding = self._close_block(chunk[-1][0], tail)
                if finding is not None:
                    self.reset()
                    return finding
        return None

    def verdict_due(self, step: int) -> int | None:
        """The step the current block closes, when that block may be the verdict."""
        if self.best is None or self.waited + 1 < self.patience or self._converged():
            return None
        return self.seen + self.window - self.block_count

    def _noisy(self, mean: float) -> bool:
        """The block's mean is too noisy to compare at min_improvement: its standard error
        (from step-to-step differences, which a trend does not inflate) is above a quarter
        of it. A mean of 50 losses of a net at chance is within 0.1%; a learning net's
        mini-batches make it 1-5%, which a block of 200 brings down by 2x."""
        count = self.block_count
        given = getattr(self, "_given", None) or self.settings
        if count < 3 or self.window >= MAX_BLOCK or "window" in given.model_fields_set:
            return False  # a window you set is kept
        noise = math.sqrt(self.block_sq / (2 * (count - 1)) / count)
        return noise > self.settings.min_improvement * abs(mean) / 4

    def _close_block(self, step: int, tail: bool) -> Finding | None:
        s = self.settings
        mean = self.block_sum / self.block_count
        noisy = self._noisy(mean)
        self.block_sum, self.block_count, self.block_sq, self.previous = 0.0, 0, 0.0, None
        if self.first is None:  # the median: a few exploding steps do not make a start
            ordered = sorted(self.first_values)
            self.first, self.first_values = ordered[len(ordered) // 2], []
        if noisy:  # longer blocks, and the best is judged again from them
            self.block = min(MAX_BLOCK, 2 * self.window)
            self.best, self.waited = None, 0
            return None
        if (self.best is None or mean < self.best - s.min_improvement * abs(self.best)
                or mean > self.best + s.new_level * abs(self.best)):
            self.best, self.best_step, self.waited = mean, step, 0
            return None
        self.waited = 0 if tail else self.waited + 1
        if self.waited < self.patience or self._converged():
            return None
        target = self.best - s.min_improvement * abs(self.best)
        return Finding(step, mean, target, (
            f"loss has not improved by {s.min_improvement:.0%} for {self.waited * self.window} "
            f"steps: its mean over the {self.window} steps to step {step} is {fmt(mean)}, the "
            f"best such mean {fmt(self.best)} (to step {self.best_step}); it started at "
            f"{fmt(self._start())}"))

    def _start(self) -> float | None:
        """Where the loss started: the run's first steps (a bigram table learns within its
        warm-up: its first block is already the plateau), else the first block's median."""
        return self.start if self.start is not None else self.first

    def _converged(self) -> bool:
        """The best block fell more than ``max_progress`` below the start: a plateau there is
        a run that has learned what it could (a healthy run converging early at a constant
        learning rate), not one that never learned."""
        start = self._start()
        if start is None or self.best is None:
            return False
        return self.best < start - self.settings.max_progress * abs(start)


class DivergenceSettings(RuleSettings):
    warmup_steps: int = warmup_default(100)
    window: int = Field(50, ge=4, description="Steps whose interquartile mean smooths the loss "
                        "(the middle half: single hard batches and lucky ones do not count).")
    progress_lost: float = Field(0.5, gt=0, description="Fire when the smoothed loss gives back "
                                 "this fraction of the progress from its first value to its "
                                 "best...")
    min_rise: float = Field(0.5, gt=0, description="...and rises at least this fraction of "
                            "|best| above its best (so a run that made little progress is not "
                            "judged on noise; 0.5: the interquartile mean of 50 steps 1.5x its "
                            "best is no mini-batch noise, and 1.0 waited for the loss to double "
                            "while it had long given back half its progress).")
    lr_climb: float = Field(1.5, gt=1, description="While the learning rate is above this "
                            "multiple of the largest it had reached by the loss's best step, "
                            "half the rise is enough (progress_lost and min_rise halved): a "
                            "loss that climbs while the rate grows past any the run learned "
                            "at is the end of an LR range test, not noise (a warm restart "
                            "returns to an earlier peak, not beyond it).")


class DivergenceRule(Rule):
    """The smoothed loss climbed far above its best (Lightning's ``divergence_threshold`` is
    one absolute number the user must know in advance; this one is relative to the run)."""

    name = "divergence"
    needs = frozenset({"steps"})
    judges_updates = True
    Settings = DivergenceSettings
    settings: DivergenceSettings
    state_fields = ("recent", "start", "best", "best_step", "best_noise", "lr_peak",
                    "lr_at_best")

    def __init__(self, settings: DivergenceSettings | None = None) -> None:
        super().__init__(settings)
        self.recent: deque[float] = deque(maxlen=self.settings.window)
        self.start: float | None = None
        self.best: float | None = None
        self.best_step = 0
        self.best_noise = 0.0  # the standard error of the best smoothed loss (see _noise)
        self.lr_peak: float | None = None  # the largest learning rate read so far
        self.lr_at_best: float | None = None  # ... by the step of the best smoothed loss
        self._climbing = False  # the learning rate is lr_climb x lr_at_best or more, now
        self._allowed: float | None = None  # the rise the last judged window was allowed
        self._smoothed = 0.0
        self._threshold = 0.0  # ... and the level it fires above (best + allowed + luck)

    def fit(self, planned_steps: int) -> str | None:
        self.sized(planned_steps, warmup_steps=min(100, planned_steps // 20))
        return None

    def check(self, window: Window) -> Finding | None:
        finite_losses = window.finite_losses()
        if window.repaired or window.tail:  # outlier batches, skipped or known: no trend
            left_out = window.repaired | window.tail
            finite_losses = [(s, v) for s, v in finite_losses if s not in left_out]
        if not finite_losses:
            return None
        self.recent.extend(map(_second, finite_losses))
        last = finite_losses[-1][0]
        lr = window.max_lr if window.max_lr is not None else window.lr
        if finite(lr):
            self.lr_peak = lr if self.lr_peak is None else max(self.lr_peak, lr)  # type: ignore[type-var]
        self._climbing = (finite(lr) and self.lr_at_best is not None and self.lr_at_best > 0
                          and lr >= self.settings.lr_climb * self.lr_at_best)  # type: ignore[operator]
        if len(self.recent) < self.settings.window:
            return None
        finding = self._judge(last, _interquartile_mean(self.recent)) or self._rising(last)
        if finding is not None:
            self.reset()
        return finding

    def rolled_back(self) -> None:
        """A rollback put the weights back to before a spike: the window's losses were
        theirs (the start and the best stay; see ``restored_to``)."""
        self.recent.clear()

    def restored_to(self, step: int) -> None:
        """The rollback's weights are step ``step``'s: from before the best (the only
        checkpoint an early burst finds may be step 1's), their loss would read as a climb
        from a best they never reached. The start and the best are found again."""
        if step < self.best_step:
            self.best = self.start = None
            self.best_step, self.best_noise, self.lr_at_best = 0, 0.0, None

    def _rising(self, step: int) -> Finding | None:
        """The faster confirmation: the newer half of the window is above the threshold and
        the whole window already half-way there (the loss climbs: a window's worth of steps
        rising, not a spike in its newest steps, which the whole window would not follow).
        The interquartile mean of 50 steps lags a steady climb by ~25 steps."""
        if self._allowed is None or not self.active_at(step):
            return None
        best, allowed, smoothed = self.best, self._allowed, self._smoothed
        newer = _interquartile_mean(list(self.recent)[len(self.recent) // 2:])
        threshold = self._threshold
        if newer <= threshold or smoothed <= best + allowed / 2:  # type: ignore[operator]
            return None
        return Finding(step, newer, threshold, (
            f"loss diverged: {fmt(newer)} at step {step} (mean of the middle half of the last "
            f"{len(self.recent) - len(self.recent) // 2} steps; of the last {len(self.recent)}: "
            f"{fmt(smoothed)}), up from its best {fmt(best)} at step {self.best_step}; it "
            f"started at {fmt(self.start)} (threshold {fmt(threshold)}"
            f"{self._lr_note()})"))

    def _luck(self) -> float:
        """How much luck the best holds: it is the lowest of many noisy smoothed losses, so
        it sits below the level the run truly reached (a batch-of-4 loss on noisy labels dips
        for a few dozen steps, then goes back to its plateau: a rise from the dip is no
        divergence). Two standard errors of the best's window; a smooth loss has little."""
        return NOISE_SIGMAS * self.best_noise

    def _judge(self, step: int, smoothed: float) -> Finding | None:
        # the start and the best count from the first steps; only firing waits for warm-up
        if self.start is None or self.best is None:
            self.start = self.best = smoothed
            self.best_step, self.best_noise = step, _noise(self.recent)
        if smoothed < self.best or self.lr_at_best is None:
            if smoothed < self.best:
                self.best, self.best_step = smoothed, step
                self.best_noise = _noise(self.recent)
            self.lr_at_best = self.lr_peak
        self._allowed = None
        if not self.active_at(step):
            return None
        s = self.settings
        allowed = max(s.progress_lost * (self.start - self.best), s.min_rise * abs(self.best))
        if self._climbing:
            allowed /= 2
        threshold = self.best + allowed + self._luck()
        self._allowed, self._smoothed, self._threshold = allowed, smoothed, threshold
        if smoothed <= threshold:
            return None
        return Finding(step, smoothed, threshold, (
            f"loss diverged: {fmt(smoothed)} at step {step} (mean of the middle half of the last "
            f"{s.window} steps), up from its best {fmt(self.best)} at step {self.best_step}; it "
            f"started at {fmt(self.start)} (threshold {fmt(threshold)}"
            f"{self._lr_note()})"))

    def _lr_note(self) -> str:
        if not self._climbing:
            return ""
        return (f", half the rise: the learning rate is {self.settings.lr_climb:g}x or more the "
                f"{fmt(self.lr_at_best)} it had reached by then")


_second = operator.itemgetter(1)
MIN_BLOCK = 50  # steps: the shortest block of losses averaged (grown where noise needs it)
MAX_BLOCK = 200
FLAT_STEPS = 300  # a loss flat for this long after its best block is stuck, not in a saddle


def _squared_step(value: float, before: float | None) -> float:
    return 0.0 if before is None else (value - before) ** 2


def _watched(metrics: dict[str, float]) -> str | None:
    """val_loss when logged, else the first val_* metric, else eval_loss (None: nothing to
    watch yet)."""
    return "val_loss" if "val_loss" in metrics else validation_metric(metrics)


NOISE_SIGMAS = 2.0  # divergence: standard errors of luck taken off the best (see _luck)


def _noise(values: deque[float] | list[float]) -> float:
    """The standard error of the interquartile mean of ``values``, from their step-to-step
    noise: the median absolute deviation of the differences of neighbours from their median
    (robust to a hard batch, and a trend only shifts the differences) is 0.6745 x sqrt(2)
    sigma for a normal noise. An interquartile mean's variance is ~1.2 sigma^2 / n."""
    n = len(values)
    if n < 4:
        return 0.0
    losses = list(values)
    jumps = sorted(b - a for a, b in zip(losses, losses[1:]))
    middle = jumps[len(jumps) // 2]
    deviations = sorted(abs(jump - middle) for jump in jumps)
    sigma = deviations[len(deviations) // 2] / (0.6745 * math.sqrt(2))
    return 1.1 * sigma / math.sqrt(n)


def _interquartile_mean(values: deque[float] | list[float]) -> float:
    ordered = sorted(values)
    quarter = len(ordered) // 4
    middle = ordered[quarter:len(ordered) - quarter]
    return sum(middle) / len(middle)


_HIGHER_IS_BETTER = ("acc", "auc", "f1", "precision", "recall", "score", "map", "iou", "bleu")


class OverfittingSettings(RuleSettings):
    metric: str | None = Field(None, description="The validation metric passed to run.log; "
                               "default: val_loss, or, in a run that logs no val_loss, the "
                               "first val_* metric it logs (val_acc: worse means lower).")
    mode: Literal["auto", "min", "max"] = Field("auto", description="Whether lower or higher "
                                                "is better; auto: max for names with acc, auc, "
                                                "f1, precision, recall, score, map, iou, bleu.")
    patience: int = Field(3, ge=1, description="Evaluations in a row worse than the best "
                          "(Lightning's EarlyStopping: 3; Keras': 0).")
    min_worsening: float = Field(0.01, ge=0, description="How much worse than the best counts, "
                                 "relative to |best| (0.01 = 1%): flat is not worse.")


class OverfittingRule(Rule):
    """Validation got worse for ``patience`` evaluations while the training loss kept falling.

    Needs ``run.log(val_loss=...)`` (or the configured metric, or another ``val_*`` metric
    when no ``val_loss`` is logged: a classifier on random labels that logs only ``val_acc``
    memorises its training set while the accuracy stays at chance); silent without one.
    """

    name = "overfitting"
    needs = frozenset({"evals"})
    Settings = OverfittingSettings
    settings: OverfittingSettings
    state_fields = ("metric", "best", "best_step", "best_train", "worse", "last")

    def __init__(self, settings: OverfittingSettings | None = None) -> None:
        super().__init__(settings)
        self.metric: str | None = self.settings.metric
        self.best: float | None = None
        self.best_step = 0
        self.best_train: float | None = None
        self.worse = 0
        self.last: float | None = None  # the previous evaluation's score

    @property
    def sign(self) -> float:
        mode = self.settings.mode
        if mode == "auto":
            name = (self.metric or "val_loss").lower()
            mode = "max" if any(word in name for word in _HIGHER_IS_BETTER) else "min"
        return -1.0 if mode == "max" else 1.0

    def check(self, window: Window) -> Finding | None:
        return self.first_finding(window.evals, self._judge)

    def _judge(self, sample: EvalSample) -> Finding | None:
        if self.metric is None:
            self.metric = _watched(sample.metrics)
        value = sample.metrics.get(self.metric) if self.metric else None
        if not finite(value) or not self.active_at(sample.step):
            return None
        score = self.sign * value  # type: ignore[operator]
        last, self.last = self.last, score
        if self.best is None or score < self.best:
            self.best, self.best_step, self.best_train = score, sample.step, sample.train_loss
            self.worse = 0
            return None
        if score > self.best + self.settings.min_worsening * abs(self.best):
            # still worse than the best, but better than the evaluation before: recovering
            # (a noisy validation set), which neither counts nor clears the count
            recovering = last is not None and score < last
            self.worse += 0 if recovering else 1
        else:
            self.worse = 0
        if self.worse < self.settings.patience or not self._training_improved(sample):
            return None
        return Finding(sample.step, value, self.sign * self.best, self._message(sample, value))

    def _training_improved(self, sample: EvalSample) -> bool:
        if not finite(sample.train_loss) or not finite(self.best_train):
            return True  # without a training loss this is plain early stopping
        return sample.train_loss < self.best_train  # type: ignore[operator]

    def _message(self, sample: EvalSample, value: float) -> str:
        metric, best = self.metric, self.sign * self.best  # type: ignore[operator]
        text = (f"overfitting: {metric} {fmt(value)} at step {sample.step} is worse than its best "
                f"{fmt(best)} (step {self.best_step}) for {self.worse} evaluations in a row")
        if finite(sample.train_loss) and finite(self.best_train):
            text += (f" while the training loss fell from {fmt(self.best_train)} to "
                     f"{fmt(sample.train_loss)}")
        return text
