"""Loss spikes: one outlier step is skipped, a spike that lasts is rolled back.

What large-model teams do by hand, with their numbers as defaults: OLMo-core's
``SkipStepOptimizer`` skips an update whose loss is a > 6 sigma outlier over a 128-step
window; llm-foundry's ``KillLossSpike`` calls a spike a loss >= 2x its moving mean for 5
steps in a row; PaLM restarted from a checkpoint ~100 steps before a spike and skipped
200-500 batches.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import accumulate, chain, repeat
from operator import ge, mul, sub
from typing import Any

from pydantic import Field

from prudent.monitor.base import (
    ActionName,
    Finding,
    Rule,
    RuleSettings,
    Window,
    action_default,
    fmt,
    warmup_default,
)
from prudent.monitor.tail import describe_tail, in_tail, new_outliers, note_outlier

__all__ = ["LossSpikeRule"]


class LossSpikeSettings(RuleSettings):
    action: list[ActionName] = action_default("skip", "rollback")
    warmup_steps: int = warmup_default(100)
    cooldown_steps: int = Field(0, ge=0, description="After firing, the rule stays silent for "
                                "this many steps (matters for actions that do not stop).")
    window: int = Field(128, ge=16, description="Finite losses in the moving mean and standard "
                        "deviation (OLMo-core: 128 steps).")
    sigmas: float = Field(6.0, gt=0, description="With action skip: a step whose loss is more "
                          "than this many standard deviations above the moving mean has its "
                          "optimizer update skipped (OLMo-core: 6).")
    max_skips: int = Field(10, ge=1, description="At most this many skipped updates per window "
                           "(a bad shard's run of 10 batches in a row is skipped whole); past "
                           "that, the outliers are a spike that lasts, not a bad batch.")
    factor: float = Field(2.0, gt=1, description="A spike: the loss is at least this multiple "
                          "of its moving mean (llm-foundry: 2)...")
    patience: int = Field(5, ge=1, description="...for this many updated steps in a row "
                          "(llm-foundry: 5). A step whose update was skipped was repaired, "
                          "not counted: repair before stop, the skips' budget goes first. "
                          "Then the action runs (rollback).")
    min_sigmas: float = Field(3.0, ge=0, description="...and each of those steps at least this "
                              "many standard deviations above the moving mean: a loss near its "
                              "floor has batches at 2x its mean all the time (a digits "
                              "classifier at 0.04 has a per-batch deviation of 0.04; a language "
                              "model at 2.5 nats one of ~0.05, where 2x is 50 deviations).")
    skip_sync: bool = Field(False, description="With the loss on a GPU, judging each step before "
                            "its update means waiting for the loss every step: off by default "
                            "(the spike is still judged every check, for rollback).")


class LossSpikeRule(Rule):
    """The training loss jumped far above its moving mean and stayed there (``factor`` x for
    ``patience`` steps). Single outlier steps are the ``skip`` action's business: the monitor
    asks :meth:`skips` before each optimizer update."""

    name = "loss_spike"
    needs = frozenset({"steps"})
    Settings = LossSpikeSettings
    settings: LossSpikeSettings
    # the thresholds are state too (see _set_threshold): a resumed run must use the ones the
    # uninterrupted run used, not ones worked out again from a later ``recent``
    state_fields = ("recent", "streak", "streak_start", "held", "skipped", "thresholds",
                    "outliers")

    def __init__(self, settings: LossSpikeSettings | None = None) -> None:
        super().__init__(settings)
        self.recent: deque[float] = deque(maxlen=self.settings.window)
        self.streak = 0
        self.streak_start: int | None = None
        # the streak's losses, held out of the baseline while they may be a spike's (a spike
        # never raises the mean it is judged against); a streak that ends short of patience was
        # the loss's own noise, and they join it then (see _end_streak)
        self.held: list[float] = []
        self.skipped: deque[int] = deque(maxlen=self.settings.max_skips)
        # [first step it applies to, skip above, mean, standard deviation, losses] of ``recent``
        # (``losses``: how many it held then), oldest first: with a grid, the one worked out at
        # a grid step g applies from g + grid + 1
        self.thresholds: list[list[Any]] = [[0, math.inf, None, 0.0, 0]]
        self._sum = 0.0  # of recent, kept as losses come and go
        self._repaired: frozenset[int] = frozenset()  # the window's skipped updates, all rules'
        self.outliers = new_outliers()  # (step, loss) of each outlier met (prudent.monitor.tail)
        self.tail_step = -1  # the last step whose outlier was trained as the data's own tail

    def fit(self, planned_steps: int) -> str | None:
        # warm-up: at least the window is filled, at most a tenth of the run
        self.sized(planned_steps, warmup_steps=max(32, min(100, planned_steps // 10)))
        return None

    @property
    def skip_above(self) -> float:
        """The newest threshold (in force at once without a grid; see :meth:`watch_above`)."""
        return float(self.thresholds[-1][1])

    @property
    def watch_above(self) -> float:
        """A loss above this may be skipped at some step soon: the lowest threshold kept."""
        return float(min(t[1] for t in self.thresholds))

    def _at(self, step: int) -> list[Any]:
        """The threshold in force at ``step``."""
        for threshold in reversed(self.thresholds):
            if threshold[0] <= step:
                return threshold
        return [0, math.inf, None, 0.0, 0]

    # per step, before the update --------------------------------------------------------
    def skips(self, step: int, loss: float) -> bool:
        """True when ``loss`` at ``step`` is an outlier whose update should be skipped (and the
        budget of skips per window allows it). Cheap: one comparison on most steps."""
        return self.judge_outlier(step, loss) > 0 and self.take_skip(step)

    def judge_outlier(self, step: int, loss: float) -> float:
        """:meth:`outlier_sigmas`, with the outlier remembered, and 0 for one of the outliers
        the run keeps meeting (then ``tail_step`` is ``step``; see :mod:`prudent.monitor.tail`).
        """
        sigmas = self.outlier_sigmas(step, loss)
        if not sigmas:
            return 0.0
        outliers, span = self.outliers, self.settings.window
        trained = in_tail(outliers, step, loss, span)
        note_outlier(outliers, step, loss)
        if trained:
            self.tail_step = step
            return 0.0
        return sigmas

    def describe_tail(self, step: int, loss: float) -> str:
        return (f"loss {fmt(loss)} at step {step} is above the skip threshold "
                f"{fmt(self._at(step)[1])}, but it is one of "
                + describe_tail(self.outliers, step, self.settings.window, "loss"))

    def outlier_sigmas(self, step: int, loss: float) -> float:
        """How many standard deviations ``loss`` is above its moving mean when it is an
        outlier to skip at ``step`` (inf for a flat history), else 0."""
        threshold = self._at(step)
        if not loss > threshold[1] or not math.isfinite(loss) or not self.active_at(step):
            return 0.0
        mean, std = threshold[2] or 0.0, threshold[3]
        return (loss - mean) / std if std else math.inf

    def take_skip(self, step: int) -> bool:
        """Count a skip at ``step`` if the budget per window allows it (under torchrun every
        rank counts the skips they agreed on, so their budgets stay alike)."""
        if len(self.skipped) == self.skipped.maxlen and step - self.skipped[0] < self.settings.window:
            return False  # the budget is spent: a spike that lasts, for check() to judge
        self.skipped.append(step)
        return True

    def describe_skip(self, step: int, loss: float) -> str:
        threshold = self._at(step)
        _, _, mean, std = threshold[:4]
        mean = mean or 0.0
        # the losses the threshold's mean came from (a checkpoint of before: the window now)
        losses = threshold[4] if len(threshold) > 4 else len(self.recent)
        recent = sum(1 for s in self.skipped if step - s < self.settings.window)
        return (f"loss {fmt(loss)} at step {step} is {(loss - mean) / std if std else math.inf:.3g}"
                f" standard deviations above its mean {fmt(mean)} over the last "
                f"{losses} steps (threshold {self.settings.sigmas:g}): its optimizer "
                f"update was skipped ({recent} of at most {self.settings.max_skips} in "
                f"{self.settings.window} steps)")

    # per window ---------------------------------------------------------------------------
    def check(self, window: Window) -> Finding | None:
        finite, grid = window.finite_losses(), self.check_grid
        self._repaired = window.repaired  # every rule's skipped updates, not only this one's
        if not grid:
            return self._check_part(finite, None)
        # the window's steps up to each grid step it reaches, a threshold worked out there (as
        # of that step's loss), so which updates are skipped never depends on the checks' timing
        last = window.steps[-1] if window.steps else 0
        start, done = 0, 0  # the newest grid step worked out
        for i in range(1, len(finite) + 1):
            bound = -(-finite[i - 1][0] // grid) * grid  # the grid step at or after this one
            if i < len(finite) and finite[i][0] <= bound:
                continue
            finding = self._check_part(finite[start:i], bound if last >= bound else -1)
            if finding is not None:
                return finding
            start, done = i, bound if last >= bound else done
        if last % grid == 0 and done < last:
            self._set_threshold(last)  # a grid step whose part of the window had no finite loss
        return None

    def _check_part(self, finite: list[tuple[int, float]], renew_at: int | None
                    ) -> Finding | None:
        """``renew_at``: the grid step ``finite`` ends at (-1: it ends before one; None: no
        grid, the threshold is worked out again and in force at once)."""
        if self._calm(finite):
            self._take_calm(finite)
        else:
            finding = self._judge_each(finite)
            if finding is not None:
                return finding
        self._set_threshold(renew_at) if renew_at != -1 else self._resum()
        return None

    def _judge_each(self, finite: list[tuple[int, float]]) -> Finding | None:
        """:meth:`_judge` on each step, inlined (a healthy loss near its floor has a batch at
        2x its mean every few dozen steps: most windows come here, ~100 steps each)."""
        s, recent, skipped = self.settings, self.recent, self._repaired.union(self.skipped)
        # a hair below factor: rounding never hides a spike step from _judge, which decides
        factor, warmup, least = s.factor * (1 - 1e-9), s.warmup_steps, min(32, s.window)
        full, total = recent.maxlen, self._sum
        for step, loss in finite:
            count = len(recent)
            if count >= least and total > 0 and loss * count >= factor * total and step > warmup:
                self._sum = total
                finding = self._judge(step, loss, step in skipped)
                total = self._sum
                if finding is not None:
                    return finding
                continue
            if self.held:
                self._sum = total
                self._end_streak()
                total = self._sum
            self.streak, self.streak_start = 0, None
            if step not in skipped:
                if len(recent) == full:
                    total -= recent[0]
                recent.append(loss)
                total += loss
        self._sum = total
        return None

    def _calm(self, finite: list[tuple[int, float]]) -> bool:
        """True when no step of a window reaches ``factor`` x its moving mean (the usual
        window, once the moving window is full and no update of the window was skipped):
        then it needs no step-by-step pass. The moving sums the steps would meet come from
        prefix sums over the kept losses and the window's own, compared at C speed with a hair
        of margin so that rounding never hides a spike step. False sends it step by step."""
        if not finite:
            return True
        size, recent, skipped = self.settings.window, self.recent, self.skipped
        if len(recent) < size or (skipped and finite[0][0] <= skipped[-1]) or self.held:
            return False
        losses = [loss for _, loss in finite]
        prefix = list(accumulate(chain(recent, losses), initial=0.0))
        count = len(losses)
        sums = list(map(sub, prefix[size:size + count], prefix[:count]))  # of the `size` before
        if min(sums) <= 0:
            return False  # a mean at or below zero: no spike by ratio, judged step by step
        limits = map(mul, sums, repeat(self.settings.factor * (1 - 1e-9) / size))
        return not any(map(ge, losses, limits))

    def _take_calm(self, finite: list[tuple[int, float]]) -> None:
        """What :meth:`_judge` does on a calm window, at C speed: the losses join the moving
        window (no update in it was skipped), the streak is over."""
        if finite:  # (no streak held: see _calm)
            self.recent.extend([loss for _, loss in finite])
            self.streak, self.streak_start = 0, None

    def _resum(self) -> None:
        self._sum = math.fsum(self.recent)  # no drift from the running sum

    def _judge(self, step: int, loss: float, skipped: bool) -> Finding | None:
        s = self.settings
        mean = self._moving_mean()
        if (mean is not None and mean > 0 and loss >= s.factor * mean
                and loss >= mean + s.min_sigmas * self._at(step)[3] and self.active_at(step)):
            # the spike begins at its first step; a step whose update was skipped is repaired
            # (the weights never saw it): it neither grows the streak nor ends it
            self.streak_start = step if self.streak_start is None else self.streak_start
            if skipped:
                return None
            self.streak += 1
            self.held.append(loss)
            if self.streak >= s.patience:
                return self._fire(step, loss, mean)
            return None
        self._end_streak()
        if not skipped:
            self._add(loss)
        return None

    def _end_streak(self) -> None:
        """The streak ended short of ``patience``: the losses it held were the loss's own
        noise, and join the baseline. Near a floor the loss is heavy-tailed (a digits or a
        toy DDP classifier at 0.01 meets batches at 0.05-0.3 every few dozen steps); a
        baseline without them has half the mean and a third of the deviation the loss really
        has, and five ordinary steps in a row above it read as a spike (a false stop at step
        340 of a healthy 9,600-step run under torchrun, where no rollback softens it)."""
        self.streak, self.streak_start = 0, None
        for loss in self.held:
            self._add(loss)
        self.held = []

    def _add(self, loss: float) -> None:
        recent = self.recent
        if len(recent) == recent.maxlen:
            self._sum -= recent[0]
        recent.append(loss)
        self._sum += loss

    def _fire(self, step: int, loss: float, mean: float) -> Finding:
        start = self.streak_start if self.streak_start is not None else step
        finding = Finding(step, loss, self.settings.factor * mean, (
            f"loss spike: the loss has been >= {self.settings.factor:g}x its moving mean "
            f"{fmt(mean)} for {self.streak} updated steps since step {start} (now {fmt(loss)} at "
            f"step {step})"), since=start)
        # the baseline from before the spike stays, without the spike's losses
        self.streak, self.streak_start, self.held = 0, None, []
        self._set_threshold()
        return finding

    def rewound(self, steps_back: int) -> None:
        """A rollback put back weights ``steps_back`` steps older than the spike: a baseline
        from after them is forgotten (learnt again from the restored weights' losses)."""
        if steps_back > len(self.recent):
            self.recent.clear()
            self.held = []
            self.skipped.clear()
            self._set_threshold()

    def _moving_mean(self) -> float | None:
        if len(self.recent) < min(32, self.settings.window):
            return None
        return self._sum / len(self.recent)

    def _set_threshold(self, grid_step: int | None = None) -> None:
        """The threshold of ``recent`` now: worked out at ``grid_step``, it applies from one
        grid later (by then the check that reaches a grid step has run, whenever checks fell:
        they are never further apart than the grid), so each step's threshold is the same in
        every run of the same losses; None: in force at once, older ones dropped (no grid, or
        a spike or a rollback, after which the run has changed course anyway)."""
        self._resum()
        mean = self._moving_mean()
        std = 0.0
        if mean is not None:
            deviations = list(map(sub, self.recent, repeat(mean)))
            std = math.sqrt(math.fsum(map(mul, deviations, deviations)) / (len(self.recent) - 1))
        skip = math.inf if mean is None else mean + self.settings.sigmas * std
        if grid_step is None or not self.check_grid:
            self.thresholds = [[0, skip, mean, std, len(self.recent)]]
            return
        self.thresholds.append([grid_step + self.check_grid + 1, skip, mean, std,
                                len(self.recent)])
        del self.thresholds[:-4]  # a window's steps are never more than two grids back

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.thresholds = [list(t) for t in self.thresholds]
        if "thresholds" in state:
            self._resum()
        else:  # a checkpoint from before the thresholds were saved
            self._set_threshold()
