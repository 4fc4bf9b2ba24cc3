"""What a rule sees (:class:`Window`), what it says (:class:`Finding`), and the :class:`Rule` base.

Rules are plain Python over host floats: the monitor turns the device's statistics into a
:class:`Window` a few steps at a time (one transfer per device), so a rule never touches a
tensor and never makes the device wait.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ACTION_NAMES", "LR_FRACTION_HELP", "MIN_SAMPLES", "START_STEPS", "ActionName",
           "ActivationSample", "EvalSample", "Finding", "LayerSample", "MemorySample", "Rule",
           "RuleSettings", "Window", "action_default", "confirm_at", "confirm_gap", "finite", "fmt",
           "validation_metric", "warmup_default"]

ActionName = Literal["stop", "reduce_lr", "alert", "capture", "prune", "skip", "rollback"]
ACTION_NAMES: tuple[str, ...] = ("alert", "capture", "prune", "reduce_lr", "rollback", "skip",
                                 "stop")
MIN_SAMPLES = 2  # the fewest layer samples in a row a rule sized to a short run fires on
START_STEPS = 5  # the run's first losses whose median is where it started (Window.start_loss)


class RuleSettings(BaseModel):
    """The fields every rule has; a rule's own ``Settings`` subclasses this and adds its knobs."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Run this rule.")
    action: list[ActionName] = Field(default_factory=lambda: ["stop"], description="What to do "
                                     "when it fires: stop, reduce_lr, alert, capture, prune, "
                                     "rollback (loss_spike) or skip (loss_spike); one or a list, "
                                     "done in order.")
    warmup_steps: int = Field(0, ge=0, description="Steps at the start of the run during which "
                              "the rule does not fire (initialisation transients).")
    cooldown_steps: int = Field(100, ge=0, description="After firing, the rule stays silent for "
                                "this many steps (matters for actions that do not stop).")

    @field_validator("action", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


LR_FRACTION_HELP = ("The rule sleeps while the learning rate is below this fraction of its peak: "
                    "a schedule's tail is meant to flatten the loss and shrink the updates.")


def action_default(*names: str) -> Any:
    """A rule's own default for ``action`` (the field keeps its type and description)."""
    return Field(default_factory=lambda: list(names),
                 description=RuleSettings.model_fields["action"].description)


def warmup_default(steps: int) -> Any:
    """A rule's own default for ``warmup_steps``."""
    return Field(steps, ge=0, description=RuleSettings.model_fields["warmup_steps"].description)


@dataclass(frozen=True)
class Finding:
    """A rule's verdict: at ``step`` a ``value`` crossed a ``threshold``; ``message`` says so
    with the numbers (``loss is NaN at step 1834 (last finite 2.31)``)."""

    step: int
    value: float | None
    threshold: float | None
    message: str
    since: int | None = None  # the step the condition began, when earlier (a spike's first step)
    finished: bool = False  # the training is done (no more progress), not sick: a completed run


@dataclass(frozen=True)
class LayerSample:
    """Per-layer statistics taken at one step every ``sample_every_steps``.

    ``grad_rms``: RMS of each weight matrix's gradient (tensors with >= 2 dims, where a near
    zero gradient is a symptom rather than an artefact like a bias before a BatchNorm).
    ``update_ratio``: ||weights after the optimizer step - before|| / ||before|| over all
    parameters; ``layer_update_ratio`` the same per tensor.
    """

    step: int
    grad_rms: dict[str, float]
    update_ratio: float | None = None
    layer_update_ratio: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ActivationSample:
    """For each hooked activation (``name`` -> fraction): ReLU units that never fired over the
    sampled batch, or sigmoid/tanh units that stayed saturated over it (``kinds`` says which)."""

    step: int
    inactive: dict[str, float]
    kinds: dict[str, str]


@dataclass(frozen=True)
class MemorySample:
    """Memory at one step: what this process holds and, for the projection to an
    out-of-memory error, what is left (host: available memory; device: its total)."""

    step: int
    host_bytes: int | None
    device_bytes: int | None
    wall: float = 0.0  # time.monotonic() when sampled
    host_available: int | None = None
    device_total: int | None = None


@dataclass(frozen=True)
class EvalSample:
    """What ``run.log`` reported, with the mean training loss since the previous log and that
    mean's standard error (None under two losses)."""

    step: int
    metrics: dict[str, float]
    train_loss: float | None
    train_loss_se: float | None = None


@dataclass
class Window:
    """The host values of a few consecutive steps, handed to every rule at once.

    ``steps``, ``loss`` and ``grad_norm`` are parallel lists: ``loss[i]`` is the loss passed to
    ``run.step`` at ``steps[i]`` (None when the loop passed none), ``grad_norm[i]`` the global
    gradient norm (None on steps it was not measured). The sample lists hold what was measured
    in these steps, usually nothing. Values may be NaN or infinite.
    """

    steps: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)
    layers: list[LayerSample] = field(default_factory=list)
    activations: list[ActivationSample] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    evals: list[EvalSample] = field(default_factory=list)
    lr: float | None = None
    peak_lr: float | None = None
    max_lr: float | None = None  # the largest lr of every param group of every optimizer, now
    amp: bool = False
    planned_steps: int | None = None  # run.epochs(n) x the loader's length, or run.steps(n)
    step_s: float | None = None  # the mean step time lately (seconds)
    sample_every: int | None = None  # steps between two layer samples, now
    # where the run's loss started: the median of its first START_STEPS finite losses (the
    # first steps of the run, not of a rule's judging: a fast learner has learned by then)
    start_loss: float | None = None
    # steps whose optimizer update was skipped (loss_spike's repair of an outlier batch): what
    # they measured never reached the weights, so it is no evidence for a rule that judges
    # what the updates do to the model (``Rule.judges_updates``)
    repaired: frozenset[int] = frozenset()
    # steps whose outlier was trained as one of those the run keeps meeting (hard samples met
    # each epoch, ``prudent.monitor.tail``): known, judged once; no evidence for those rules
    # either. Their losses are the run's own: loss_spike's baseline takes them in
    tail: frozenset[int] = frozenset()
    _finite: list[tuple[int, float]] | None = field(default=None, init=False, repr=False,
                                                    compare=False)
    _measured: list[tuple[int, float]] | None = field(default=None, init=False, repr=False,
                                                      compare=False)

    def present(self) -> frozenset[str]:
        """The parts holding anything: ``steps``, ``layers``, ``activations``, ``memory``,
        ``evals`` (what :attr:`Rule.needs` is matched against)."""
        return frozenset(name for name in _PARTS if getattr(self, name))

    def losses(self) -> Iterator[tuple[int, float | None]]:
        return zip(self.steps, self.loss)

    def all_finite(self) -> bool:
        """No loss or gradient norm is NaN or infinite: the usual case, checked in one pass."""
        return math.isfinite(self._loss_sum() + sum(g for _, g in self.grad_norms()))

    def finite_losses(self) -> list[tuple[int, float]]:
        """``(step, loss)`` for the finite losses (computed once per window, shared by rules)."""
        if self._finite is None:
            if math.isfinite(self._loss_sum()) and None not in self.loss:
                self._finite = list(zip(self.steps, self.loss))  # type: ignore[arg-type]
            else:
                self._finite = [(s, v) for s, v in zip(self.steps, self.loss)
                                if v is not None and math.isfinite(v)]
        return self._finite

    def grad_norms(self) -> list[tuple[int, float]]:
        """``(step, norm)`` for the steps whose norm was measured (once per window)."""
        if self._measured is None:
            self._measured = [(s, g) for s, g in zip(self.steps, self.grad_norm) if g is not None]
        return self._measured

    def _loss_sum(self) -> float:
        """The sum of the losses: not finite when one of them is not (C speed: the rules run
        on the training thread)."""
        try:
            return sum(self.loss)  # type: ignore[arg-type]
        except TypeError:  # steps without a loss
            return sum(v for v in self.loss if v is not None)

    def in_schedule_tail(self, min_lr_fraction: float) -> bool:
        """True when the learning rate is below ``min_lr_fraction`` of its peak so far."""
        if not self.lr or not self.peak_lr:
            return False
        return self.lr < min_lr_fraction * self.peak_lr


_PARTS = ("steps", "layers", "activations", "memory", "evals")


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def validation_metric(metrics: dict[str, Any]) -> str | None:
    """The validation metric a rule watches by default: the first ``val_*`` logged (Keras,
    Lightning, the five lines), else ``eval_loss`` (the Hugging Face Trainer names its metrics
    ``eval_*``; other ``eval_*`` names stay a script's own: it may log them on purpose)."""
    return next((k for k in metrics if k.startswith("val_")),
                "eval_loss" if "eval_loss" in metrics else None)


def fmt(value: float | None) -> str:
    """A number for a message: 4 significant digits, ``NaN``/``inf`` spelled as people read them."""
    if value is None:
        return "none"
    if math.isnan(value):
        return "NaN"
    return f"{value:.4g}"


class Rule:
    """A check on the training's statistics. Subclass it, set ``name`` and ``Settings``, and
    implement :meth:`check`; register it with :func:`prudent.monitor.register_rule`.

    Contract (``tests/monitor/test_rule_contract.py`` holds every rule to it):

    * ``check(window)`` is called on the training thread with consecutive windows, in step
      order, never overlapping. It must be cheap pure Python (no tensors, no I/O), must not
      raise on empty lists, ``None`` or NaN, and returns the *earliest* :class:`Finding` in the
      window or ``None``.
    * Non-finite values are ``non_finite``'s business: every other rule skips them, so one NaN
      is reported once, by the rule that names it.
    * Noise is not a finding: a rule ignores ``settings.warmup_steps`` and single outliers.
    * After returning a Finding the rule starts over (clears what it accumulated), so with an
      action that does not stop it fires again only once the condition builds up anew
      (``loss_spike`` keeps its baseline from before the spike: what a rollback returns to).
    * Its state is plain data listed in ``state_fields`` (numbers, lists, dicts, deques of
      numbers), so ``state_dict()`` survives ``torch.load(weights_only=True)`` and a resumed
      run carries on exactly as the original would have.
    * Repair before stop: a rule with ``judges_updates`` (what the updates do to the model:
      an exploding gradient, a diverging loss) ignores the window's ``repaired`` steps, whose
      updates were skipped, and its ``tail`` steps, known hard batches; if the condition
      persists on the steps after them, it fires.
    * ``needs`` names the parts of the window it reads (``steps``, ``layers``,
      ``activations``, ``memory``, ``evals``); the monitor does not call it for a window where
      they are all empty. The default, all of them, is always right, just slower.
    * Where checks fall depends on timing (they are spaced by what they cost), but they are
      never more than ``check_grid`` steps apart. A rule whose state steers training (a
      threshold that skips updates) works it out as of multiples of ``check_grid`` and applies
      it one grid later, so the run's updates, and an exact resume, do not depend on the
      machine's speed.
    """

    name: ClassVar[str] = "rule"
    Settings: ClassVar[type[RuleSettings]] = RuleSettings
    state_fields: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[frozenset[str]] = frozenset(_PARTS)
    judges_updates: ClassVar[bool] = False
    check_grid = 0  # set by the monitor (0: no grid, every check counts: the rule's own tests)

    def __init__(self, settings: RuleSettings | None = None) -> None:
        self.settings = settings if settings is not None else self.Settings()

    def check(self, window: Window) -> Finding | None:
        raise NotImplementedError

    def first_finding(self, samples: Any, judge: Any) -> Finding | None:
        """The first sample ``judge`` finds a problem in; the rule then starts over."""
        for sample in samples:
            finding = judge(sample)
            if finding is not None:
                self.reset()
                return finding
        return None

    def reset(self) -> None:
        """Forget what was accumulated (called by the rule itself after it fires)."""
        fresh = type(self)(self.settings)
        for name in self.state_fields:
            setattr(self, name, getattr(fresh, name))

    def active_at(self, step: int) -> bool:
        return step > self.settings.warmup_steps

    def samples_patience(self, window: Window) -> int:
        """``settings.patience`` for a rule that counts layer samples in a row, or as many
        samples as come in a tenth of the planned run when that is fewer (a verdict within
        about a tenth of the run), but never fewer than 2: one sample is one batch, and a
        second rules out a transient. A patience you set yourself is kept."""
        patience: int = self.settings.patience  # type: ignore[attr-defined]
        given = getattr(self, "_given", None) or self.settings  # before fit() sized anything
        if not window.planned_steps or not window.sample_every or "patience" in (
                given.model_fields_set):
            return patience
        return max(MIN_SAMPLES, min(patience, window.planned_steps // 10 // window.sample_every))

    def fit(self, planned_steps: int) -> str | None:
        """Size warm-up, windows and patience to a run of ``planned_steps`` (called once the
        length is known, and again if it changes). Only fields the user did not set are
        changed. Returns why the rule cannot judge a run this short, or None."""
        return None

    def sized(self, planned_steps: int, **wanted: Any) -> None:
        """Replace the settings the user left at their defaults by ``wanted`` (see :meth:`fit`)."""
        given = getattr(self, "_given", None) or self.settings
        self._given = given
        update = {k: v for k, v in wanted.items() if k not in given.model_fields_set}
        self.settings = given.model_copy(update=update)

    def state_dict(self) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in self.state_fields}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.state_fields:
            if name in state:
                current = getattr(self, name)
                value = state[name]
                if isinstance(current, deque):
                    value = deque(value, maxlen=current.maxlen)
                setattr(self, name, value)


def _plain(value: Any) -> Any:
    if isinstance(value, deque):
        return list(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def confirm_gap(window: Window) -> int:
    """Steps from a sample (or check) that starts a streak to the one asked for to confirm it:
    a quarter of the sampling interval (5 steps of 20). Another batch, another update, a few
    steps on: what rules out one odd batch, without waiting the whole interval (on a short run
    two samples 20 steps apart took 40 steps, an eighth of it)."""
    return max(1, (window.sample_every or 20) // 4)


def confirm_at(step: int, window: Window, lead: int = 1) -> int:
    """The step of the sample that confirms one taken at ``step``: ``confirm_gap`` later, and
    at least ``lead`` steps after the steps this window holds (the sample is still to come)."""
    return max(step + confirm_gap(window), window.steps[-1] + lead if window.steps else 0)
