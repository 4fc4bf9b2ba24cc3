"""Rules on the network's insides, sampled every few steps: update sizes and dead units."""

from __future__ import annotations

from pydantic import Field

from prudent.monitor.base import (
    LR_FRACTION_HELP,
    ActionName,
    ActivationSample,
    Finding,
    LayerSample,
    Rule,
    RuleSettings,
    Window,
    action_default,
    confirm_at,
    confirm_gap,
    finite,
    fmt,
    warmup_default,
)

__all__ = ["DeadActivationsRule", "UpdateRatioRule", "confirm_at", "confirm_gap"]


ZERO_LR_GAP = 5  # steps between two reads of a zero learning rate: a later step's read is
# what excludes a schedule touching 0 once; more steps add nothing


class UpdateRatioSettings(RuleSettings):
    action: list[ActionName] = action_default("stop")
    warmup_steps: int = warmup_default(100)
    min_ratio: float = Field(1e-6, gt=0, description="Fire when ||update|| / ||weights|| stays "
                             "below this (updates too small to learn: a learning rate typo); "
                             "SageMaker's 1e-8 misses an lr 100x too small...")
    max_ratio: float = Field(1.0, gt=0, description="...or above this (each step rewrites the "
                             "weights; SageMaker: 10). Healthy training sits near 1e-3.")
    patience: int = Field(3, ge=1, description="Layer samples in a row (one every "
                          "monitor.sample_every_steps).")
    zero_lr_checks: int = Field(2, ge=1, description="A learning rate of exactly 0 in every "
                                "param group, after it was not, with more than a tenth of the "
                                "planned run to go: fire after this many checks in a row (no "
                                "noise to average: two reads exclude a schedule touching 0 "
                                "once).")
    min_lr_fraction: float = Field(0.2, ge=0, le=1, description=LR_FRACTION_HELP)


class UpdateRatioRule(Rule):
    """The optimizer's step is far too small or far too large for the weights it changes.

    Measured over all parameters together (a zero-initialised bias alone would look
    infinite); steps where nothing changed (a skipped AMP step) do not count.
    """

    name = "update_ratio"
    needs = frozenset({"layers", "steps"})  # steps: the learning rate, read at every check
    Settings = UpdateRatioSettings
    settings: UpdateRatioSettings
    state_fields = ("low", "high", "zero_checks", "zero_since", "last_lr")

    def __init__(self, settings: UpdateRatioSettings | None = None) -> None:
        super().__init__(settings)
        self.low = 0
        self.high = 0
        self.zero_checks = 0  # checks in a row that read a zero learning rate in every group
        self.zero_since: int | None = None
        self.last_lr: float | None = None  # the learning rate read at the previous check
        self._patience = self.settings.patience  # sized to the run at each check
        self._due: int | None = None  # the step a confirming sample or check is wanted at

    def fit(self, planned_steps: int) -> str | None:
        # a fortieth (on a short run the first layer sample, 20 steps in, is judged): the
        # start-up transient is the high side's (weights that start at zero take updates as
        # large as themselves for a few steps); the low side pauses while the learning rate
        # still rises (a warm-up), and the samples still need `patience` in a row
        self.sized(planned_steps, warmup_steps=min(100, planned_steps // 40))
        return None

    def check(self, window: Window) -> Finding | None:
        # the low side pauses in a schedule's tail and while the learning rate still rises
        paused = window.in_schedule_tail(self.settings.min_lr_fraction)
        paused = self._lr_rising(window) or paused
        zeroed = self._lr_zeroed(window)
        if zeroed:
            paused = False  # a learning rate of 0 well before the end is no schedule's tail
        finding = self._zero_for_good(window, zeroed)
        self._due = None
        if self.zero_checks and window.steps:  # confirm a zero read soon, not a check later
            self._due = window.steps[-1] + min(ZERO_LR_GAP, confirm_gap(window))
        if finding is not None or not window.layers:
            return finding
        self._patience = self.samples_patience(window)
        finding = self.first_finding(window.layers,
                                     lambda sample: self._judge(sample, paused, zeroed))
        if finding is None and (self.low or self.high):
            self._due = confirm_at(window.layers[-1].step, window)
        return finding

    def verdict_due(self, step: int) -> int | None:
        """A streak begun (a small or large update, a zero learning rate): the next sample or
        check that can confirm it, soon rather than a whole interval later."""
        return self._due

    def _lr_rising(self, window: Window) -> bool:
        """The learning rate rose since the previous check: a warm-up, whose first updates are
        small by design (linear from 0: below 1e-6 of the weights for a while when the peak
        update is 1e-5 of them, as in a fine-tune)."""
        last = self.last_lr
        if window.lr is not None:
            self.last_lr = window.lr
        return window.lr is not None and last is not None and window.lr > last

    def _zero_for_good(self, window: Window, zeroed: bool) -> Finding | None:
        """The learning rate of every param group read 0 at ``zero_lr_checks`` checks in a
        row: no update can move a weight (SGD, Adam, AdamW's decay all scale by it), so no
        layer sample needs to confirm it."""
        if not window.steps:
            return None  # a check at run.log right after another: nothing new read
        step = window.steps[-1]
        if not (zeroed and window.max_lr == 0 and self.active_at(step)):
            self.zero_checks, self.zero_since = 0, None
            return None
        self.zero_checks += 1
        self.zero_since = step if self.zero_since is None else self.zero_since
        if self.zero_checks < self.settings.zero_lr_checks:
            return None
        since = self.zero_since
        self.reset()
        return Finding(step, 0.0, self.settings.min_ratio, (
            f"updates stopped: the learning rate of every param group is 0 at step {step} "
            f"(read 0 at every check since step {since}; the "
            f"peak was {fmt(window.peak_lr)}), with more than a tenth of the planned run to "
            "go: does the schedule zero it by mistake?"), since=since)

    @staticmethod
    def _lr_zeroed(window: Window) -> bool:
        """The learning rate is exactly 0 after it was not, with more than a tenth of the
        planned run to go (a schedule that ends at 0 does so in its last steps)."""
        if window.lr != 0 or not window.peak_lr or not window.steps:
            return False
        return window.planned_steps is None or window.steps[-1] < 0.9 * window.planned_steps

    def _judge(self, sample: LayerSample, paused: bool, zeroed: bool = False) -> Finding | None:
        ratio, s = sample.update_ratio, self.settings
        if zeroed and ratio == 0 and self.active_at(sample.step):
            self.low += 1
            if self.low >= self._patience:
                return Finding(sample.step, 0.0, s.min_ratio, (
                    f"updates stopped: the learning rate is 0 at step {sample.step} and the "
                    f"weights did not move for {self.low} samples in a row, with more than a "
                    "tenth of the planned run to go: does the schedule zero it by mistake?"))
            return None
        if not finite(ratio) or ratio == 0 or not self.active_at(sample.step):
            return None
        self.high = self.high + 1 if ratio > s.max_ratio else 0  # type: ignore[operator]
        self.low = self.low + 1 if ratio < s.min_ratio and not paused else 0  # type: ignore[operator]
        if self.high >= self._patience:
            name, worst = _largest(sample.layer_update_ratio)
            return Finding(sample.step, ratio, s.max_ratio, (
                f"updates too large: ||update||/||weights|| is {fmt(ratio)} at step {sample.step} "
                f"(largest {name}: {fmt(worst)}), above {s.max_ratio:g} for {self.high} samples "
                "in a row: is the learning rate too high?"))
        if self.low >= self._patience:
            return Finding(sample.step, ratio, s.min_ratio, (
                f"updates too small: ||update||/||weights|| is {fmt(ratio)} at step {sample.step}, "
                f"below {s.min_ratio:g} for {self.low} samples in a row: is the learning rate "
                "too low?"))
        return None


class DeadActivationsSettings(RuleSettings):
    action: list[ActionName] = action_default("stop")
    max_fraction: float = Field(0.7, gt=0, le=1, description="Fire when more than this fraction "
                                "of a layer's units never fired (ReLU) or stayed saturated "
                                "(sigmoid, tanh) over a sampled batch (SageMaker's DeadRelu: "
                                "0.5, per unit over 1% of samples)...")
    patience: int = Field(3, ge=1, description="...in this many samples in a row.")


class DeadActivationsRule(Rule):
    """Most units of an activation layer are dead or saturated, so they pass no gradient.

    Sees ``nn.ReLU``/``ReLU6``/``Sigmoid``/``Tanh`` modules (hooked on sampled steps only);
    functional calls such as ``F.relu`` inside ``forward`` are invisible to it.
    """

    name = "dead_activations"
    needs = frozenset({"activations"})
    Settings = DeadActivationsSettings
    settings: DeadActivationsSettings
    state_fields = ("count",)

    def __init__(self, settings: DeadActivationsSettings | None = None) -> None:
        super().__init__(settings)
        self.count = 0
        self._patience = self.settings.patience  # sized to the run at each check
        self._due: int | None = None

    def check(self, window: Window) -> Finding | None:
        self._patience = self.samples_patience(window)
        finding = self.first_finding(window.activations, self._judge)
        if window.activations:
            # hooks are armed the step before a sample: at least two steps on
            self._due = (confirm_at(window.activations[-1].step, window, lead=2)
                         if finding is None and self.count else None)
        return finding

    def verdict_due(self, step: int) -> int | None:
        """Dead units seen: the next sample, soon, confirms them (see :func:`confirm_gap`);
        once it is taken, the check right after, which has it (an activation sample reaches
        the rules one check after its step)."""
        due = self._due
        if due is None or due > step:
            return due
        return step + 1 if step <= due + 1 else None

    def _judge(self, sample: ActivationSample) -> Finding | None:
        fractions = {k: v for k, v in sample.inactive.items() if finite(v)}
        if not fractions or not self.active_at(sample.step):
            return None
        name, worst = _largest(fractions)
        s = self.settings
        self.count = self.count + 1 if worst > s.max_fraction else 0
        if self.count < self._patience:
            return None
        state = "saturated" if sample.kinds.get(name) == "saturated" else "dead"
        return Finding(sample.step, worst, s.max_fraction, (
            f"{worst:.0%} of the units after {name} were {state} over the batch at step "
            f"{sample.step} (threshold {s.max_fraction:.0%}, {self.count} samples in a row)"))


def _largest(values: dict[str, float]) -> tuple[str, float]:
    if not values:
        return "?", float("nan")
    return max(values.items(), key=lambda kv: kv[1])
