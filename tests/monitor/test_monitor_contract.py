"""The contract of ``Rule`` (its docstring), held against every registered rule.

Like Optuna's storage test suite: one set of tests, run for each built-in rule and for a
user-defined one registered the documented way, so a new rule gets them for free.
"""

from __future__ import annotations

import io
import math
import random
import statistics
from collections.abc import Iterator

import pytest
import torch

from prudent.monitor import Finding, Rule, RuleSettings, Window, rule, unregister_rule
from prudent.monitor.base import ActivationSample, EvalSample, LayerSample, MemorySample
from prudent.monitor.registry import RULES
from prudent.monitor.rules import BUILTIN_RULES
from prudent.monitor.rules.numeric import _median
from tests.monitor.streams import ONSET, SICK, Run, sick_stream, stream

USER_RULE = "loss_above"
CLOCK_RULES = {"stalled"}  # judged by the watchdog's clock, not by windows


@pytest.fixture(scope="module", autouse=True)
def user_rule() -> Iterator[None]:
    @rule(USER_RULE, threshold=20.0, action="alert")
    def loss_above(window: Window, settings: RuleSettings) -> Finding | None:
        """The loss went above a fixed number (an example of a user-defined rule)."""
        for step, loss in window.losses():
            if loss is not None and math.isfinite(loss) and loss > settings.threshold:  # type: ignore[attr-defined]
                return Finding(step, loss, settings.threshold,  # type: ignore[attr-defined]
                               f"loss {loss:.3g} at step {step} is above {settings.threshold}")  # type: ignore[attr-defined]
        return None

    yield
    unregister_rule(USER_RULE)


SICK[USER_RULE] = ("loss", lambda step, v: 50.0)
ALL = [cls.name for cls in BUILTIN_RULES] + [USER_RULE]
WINDOW_RULES = [name for name in ALL if name not in CLOCK_RULES]


def make(name: str, **settings: object) -> Rule:
    cls = RULES[name]
    return cls(cls.Settings(**settings))


def first_finding(rule_: Rule, windows: list[Window]) -> tuple[int, Finding] | None:
    for index, window in enumerate(windows):
        finding = rule_.check(window)
        if finding is not None:
            return index, finding
    return None


@pytest.mark.parametrize("name", ALL)
def test_settings_reject_unknown_keys_and_describe_every_field(name: str) -> None:
    settings_cls = RULES[name].Settings
    assert issubclass(settings_cls, RuleSettings)
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        settings_cls(no_such_knob=1)
    undocumented = [f for f, info in settings_cls.model_fields.items() if not info.description]
    assert not undocumented


@pytest.mark.parametrize("name", ALL)
def test_empty_and_missing_values_are_not_findings(name: str) -> None:
    rule_ = make(name)
    assert rule_.check(Window()) is None
    gaps = Window(steps=[1, 2, 3], loss=[None, None, None], grad_norm=[None, None, None],
                  evals=[EvalSample(3, {}, None)], layers=[LayerSample(3, {})],
                  activations=[ActivationSample(3, {}, {})],
                  memory=[MemorySample(3, None, None)])
    assert rule_.check(gaps) is None


@pytest.mark.parametrize("name", ALL)
def test_a_healthy_run_with_spikes_and_noise_never_fires(name: str) -> None:
    for seed in range(3):
        assert first_finding(make(name), stream(Run(seed=seed))) is None


@pytest.mark.parametrize("name", WINDOW_RULES)
def test_a_sick_run_fires_once_with_the_step_and_the_numbers(name: str) -> None:
    windows = sick_stream(name)
    found = first_finding(make(name), windows)
    assert found is not None, f"{name} missed its sickness"
    index, finding = found
    assert finding.step >= ONSET and finding.step in windows[index].steps
    assert f"step {finding.step}" in finding.message
    for number in (finding.value, finding.threshold):
        assert number is None or isinstance(number, float)


@pytest.mark.parametrize("name", WINDOW_RULES)
def test_after_firing_the_rule_starts_over(name: str) -> None:
    rule_ = make(name)
    assert first_finding(rule_, sick_stream(name)) is not None
    state, fresh = rule_.state_dict(), make(name).state_dict()
    if name == "loss_spike":  # keeps its pre-spike baseline: what a rollback returns to
        for kept in ("recent", "thresholds"):  # the baseline's threshold too
            state[kept] = fresh[kept] = None
    assert state == fresh


@pytest.mark.parametrize("name", [n for n in WINDOW_RULES if n != "non_finite"])
def test_non_finite_values_are_left_to_non_finite(name: str) -> None:
    nan, inf = float("nan"), float("inf")
    window = Window(steps=list(range(101, 111)), loss=[nan, inf, -inf, 1.0] + [nan] * 6,
                    grad_norm=[inf, nan] + [1.0] * 8,
                    layers=[LayerSample(110, {"0.weight": nan, "1.weight": inf}, nan, {})],
                    activations=[ActivationSample(110, {"1": nan}, {"1": "dead"})],
                    evals=[EvalSample(110, {"val_loss": nan}, nan)])
    windows = [*stream(steps=100), window, *stream(steps=100)]
    assert first_finding(make(name), windows) is None
    assert first_finding(make("non_finite"), [window]) is not None


@pytest.mark.parametrize("name", WINDOW_RULES)
def test_state_dict_survives_a_checkpoint_and_resumes_exactly(name: str) -> None:
    windows = sick_stream(name)
    half = ONSET // 20  # windows before the sickness begins
    original = make(name)
    assert first_finding(original, windows[:half]) is None
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    resumed = make(name)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert repr(first_finding(resumed, windows[half:])) == repr(
        first_finding(original, windows[half:]))  # repr: NaN != NaN


@pytest.mark.parametrize("name", WINDOW_RULES)
def test_nothing_fires_during_warmup(name: str) -> None:
    assert first_finding(make(name, warmup_steps=10**6), sick_stream(name)) is None


def test_every_builtin_rule_is_registered_under_its_name() -> None:
    assert [cls.name for cls in BUILTIN_RULES] == [
        "non_finite", "loss_spike", "exploding_gradient", "vanishing_gradient",
        "loss_not_decreasing", "divergence", "overfitting", "early_stopping", "update_ratio",
        "dead_activations", "stalled", "memory_growth"]
    assert all(RULES[cls.name] is cls for cls in BUILTIN_RULES)


def test_stalled_judges_idle_time_with_a_longer_limit_before_the_first_step() -> None:
    stalled = make("stalled", timeout_s="2min", startup_timeout_s="30min")
    assert stalled.check_idle(119.0, step=40, started=True) is None  # type: ignore[attr-defined]
    finding = stalled.check_idle(121.0, step=40, started=True)  # type: ignore[attr-defined]
    assert finding is not None and finding.threshold == 120.0
    assert "no step for 121 s after step 40" in finding.message
    assert stalled.check_idle(1000.0, step=0, started=False) is None  # type: ignore[attr-defined]


def test_exploding_gradient_baseline_is_the_median_of_its_last_window_of_norms() -> None:
    generator = random.Random(0)
    rule_ = make("exploding_gradient", window=7, factor=1e9)
    norms = [generator.choice([1.0, 2.0, 3.0, generator.random()]) for _ in range(60)]
    for start in range(0, 60, 4):  # windows of 4 norms: the 7-norm history keeps rolling over
        steps = list(range(start + 1, start + 5))
        rule_.check(Window(steps=steps, loss=[1.0] * 4, grad_norm=norms[start:start + 4]))
        assert rule_._ordered == sorted(rule_.history)  # type: ignore[attr-defined]
        assert list(rule_.history) == norms[max(0, start + 4 - 7):start + 4]  # type: ignore[attr-defined]
    resumed = make("exploding_gradient", window=7)
    resumed.load_state_dict(rule_.state_dict())
    assert resumed._ordered == sorted(norms[-7:])  # type: ignore[attr-defined]
    assert _median(resumed._ordered) == statistics.median(norms[-7:])  # type: ignore[attr-defined]
    assert _median([1.0, 2.0, 3.0, 4.0]) == 2.5


def test_steps_whose_updates_were_skipped_are_no_evidence_of_an_explosion() -> None:
    """Repair before stop: three outlier batches whose updates loss_spike skipped have huge
    gradient norms; they never reached the weights. The same norms on steps that were
    updated are an explosion, and so is one that persists after the skipped steps."""
    def first_firing(repaired: frozenset[int], bad: range) -> int | None:
        rule_ = make("exploding_gradient", warmup_steps=0)
        for start in range(1, 400, 10):
            steps = list(range(start, start + 10))
            found = rule_.check(Window(
                steps=steps, loss=[1.0] * 10, grad_norm=[80.0 if s in bad else 0.5 for s in steps],
                repaired=repaired & frozenset(steps)))
            if found is not None:
                return found.step
        return None

    burst = range(300, 303)
    assert first_firing(frozenset(burst), burst) is None
    assert first_firing(frozenset(), burst) == 301  # the same steps, updated: 2 in a row
    assert first_firing(frozenset(burst), range(300, 306)) == 304  # persisted after the repair


def test_hard_batches_a_few_steps_apart_are_no_explosion_nor_are_known_tail_steps() -> None:
    """Near a loss floor, hard batches (norms 10-30x the median) come every few steps, and the
    steps between them are often not measured: two measured steps in a row stopped a healthy
    run. Patience counts steps in a row (a jump has the next step measured, so an explosion
    is followed step by step); a step trained as the run's known tail is no evidence."""
    def first_firing(measured: list[int], bad: set[int], tail: frozenset[int] = frozenset()
                     ) -> int | None:
        rule_ = make("exploding_gradient", warmup_steps=0)
        rule_.check(Window(steps=list(range(1, 101)), loss=[1.0] * 100, grad_norm=[0.5] * 100))
        steps = list(range(101, 201))
        found = rule_.check(Window(
            steps=steps, loss=[1.0] * 100,
            grad_norm=[(80.0 if s in bad else 0.5) if s in measured else None for s in steps],
            tail=tail))
        return None if found is None else found.step

    sparse = [101, 117, 133, 140, 145, 160, 176, 177, 178]
    assert first_firing(sparse, {140, 145}) is None  # measured one after the other, 5 apart
    assert first_firing(sparse, {176, 177}) == 177  # two steps in a row: an explosion
    assert first_firing(sparse, {176, 177}, tail=frozenset({176})) is None  # a known hard batch


def test_norms_at_the_level_of_the_known_hard_batches_are_no_explosion() -> None:
    """Two hard batches in a row whose losses neither the skip nor the tail judged: their
    norms are at the level of the outliers the skip met before (its tail), so no evidence;
    an explosion far above that level still is."""
    rule_ = make("exploding_gradient", warmup_steps=0)
    for step in (32, 64, 96, 128, 160):
        rule_.skips(step, 0.5, grid=True)  # the skip's median
    for step in (200, 300, 400):
        rule_.skips(step, 8.0, grid=False)  # hard batches the skip met (16x)
    rule_.check(Window(steps=list(range(401, 501)), loss=[1.0] * 100, grad_norm=[0.5] * 100))

    def norms(bad: dict[int, float]) -> Window:
        steps = list(range(501, 601))
        return Window(steps=steps, loss=[1.0] * 100,
                      grad_norm=[bad.get(s, 0.5) for s in steps])

    assert rule_.check(norms({550: 8.0, 551: 9.0})) is None  # the tail's level
    found = rule_.check(Window(steps=list(range(601, 701)), loss=[1.0] * 100,
                               grad_norm=[80.0 if s in (650, 651) else 0.5
                                          for s in range(601, 701)]))
    assert found is not None and found.step == 651  # 10x the tail's level: an explosion


def test_a_gradient_norm_that_grows_while_the_loss_reaches_new_lows_is_not_an_explosion() -> None:
    def first_firing(loss_of: object) -> int | None:
        rule_ = make("exploding_gradient", warmup_steps=0)
        for start in range(1, 400, 10):
            steps = list(range(start, start + 10))
            norms = [0.1 if step < 200 else 5.0 for step in steps]  # 50x from step 200 on
            found = rule_.check(Window(steps=steps, loss=[loss_of(s) for s in steps],  # type: ignore[operator]
                                       grad_norm=norms))
            if found is not None:
                return found.step
        return None

    # SGD with momentum leaving its small initial weights: the norm grows, the loss keeps falling
    assert first_firing(lambda step: 2.3 / (1 + step / 50)) is None
    # the same norms with a loss that stopped falling: an explosion, judged at once
    assert first_firing(lambda step: 2.3 / (1 + min(step, 190) / 50)) == 201


def test_gradients_that_vanish_once_the_loss_has_collapsed_are_convergence_not_a_starved_layer(
        ) -> None:
    """A tiny BERT that learnt its task (loss 0.69 -> 0.009) has key-weight gradients of 3e-8:
    the default stop ended that healthy run at step ~125. The same layers with a loss still
    near its start are a starved stack, and fire."""
    def first_firing(loss_of: object) -> int | None:
        rule_ = make("vanishing_gradient", warmup_steps=0)
        for start in range(1, 600, 50):
            steps = list(range(start, start + 50))
            layers = [LayerSample(start + 49, {"attention.key.weight": 3e-8,
                                               "classifier.weight": 8e-3}, 1e-3)]
            found = rule_.check(Window(steps=steps, loss=[loss_of(s) for s in steps],  # type: ignore[operator]
                                       layers=layers))
            if found is not None:
                return found.step
        return None

    assert first_firing(lambda step: 0.69 if step <= 50 else 0.009) is None
    assert first_firing(lambda step: 0.69) == 150  # the third sample in a row


def test_a_run_that_memorised_its_batch_before_the_first_check_has_converged() -> None:
    """Overfitting one batch (the sanity check before a long run): loss 2.3 -> 1e-5 within the
    first 30 steps of a 2,000-step run. Judged from the first window alone (already 1e-5),
    its vanished gradients stopped it at step 74; the run's own start says it learnt."""
    rule_ = make("vanishing_gradient", warmup_steps=0)
    for start in range(27, 400, 25):
        steps = list(range(start, start + 25))
        layers = [LayerSample(start + 24, {"2.weight": 1.8e-8, "4.weight": 4.4e-7}, 1e-3)]
        found = rule_.check(Window(steps=steps, loss=[1e-5] * 25, layers=layers, start_loss=2.3))
        assert found is None, found
    # a stack that starves while the loss stays where it started still fires
    rule_ = make("vanishing_gradient", warmup_steps=0)
    found = [rule_.check(Window(steps=[s], loss=[2.3], start_loss=2.3,
                                layers=[LayerSample(s, {"2.weight": 1.8e-8, "4.weight": 4.4e-7},
                                                    1e-3)])) for s in (50, 75, 100)]
    assert found[-1] is not None and "gradients vanish in 2.weight" in found[-1].message
