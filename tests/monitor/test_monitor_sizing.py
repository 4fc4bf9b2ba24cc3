"""Rules sized to the run's planned length, memory projected to an out-of-memory error, and a
learning rate zeroed by mistake."""

from __future__ import annotations

from prudent.monitor import MonitorSettings
from prudent.monitor.base import ActivationSample, LayerSample, MemorySample, Rule, Window
from prudent.monitor.rules import (
    DeadActivationsRule,
    LossNotDecreasingRule,
    MemoryGrowthRule,
    UpdateRatioRule,
    VanishingGradientRule,
)
from prudent.monitor.stats import StepStats
from prudent.testing import FakeClock

_MB = 1 << 20


def test_windows_shrink_to_the_run_but_not_below_noise_and_user_values_stay() -> None:
    rule = LossNotDecreasingRule()
    assert rule.fit(2260) is None
    # blocks of 50 steps (longer where noise needs it), patience 6 blocks: flat for 300
    # steps after the best block (never fewer: a saddle)
    assert (rule.settings.warmup_steps, rule.settings.window, rule.settings.patience) == (11, 50, 6)
    assert rule.fit(100_000) is None  # long runs: the defaults, a verdict within a tenth
    assert (rule.settings.window, rule.settings.patience) == (200, 5)
    mine = LossNotDecreasingRule(LossNotDecreasingRule.Settings(window=300, patience=4))
    mine.fit(2260)
    assert (mine.settings.window, mine.settings.patience, mine.settings.warmup_steps) == (300, 4, 11)
    assert LossNotDecreasingRule().fit(448) is None  # 2 + 7 blocks of 50 fit in 448
    reason = LossNotDecreasingRule().fit(300)
    assert reason is not None and "needs 351 steps" in reason and "plans 300" in reason


def memory(step: int, mb: float, wall: float, available_mb: float | None) -> MemorySample:
    left = None if available_mb is None else int(available_mb * _MB)
    return MemorySample(step, int(mb * _MB), None, wall, left)


def test_memory_growth_projects_the_out_of_memory_and_acts_within_the_horizon() -> None:
    rule = MemoryGrowthRule(MemoryGrowthRule.Settings(warmup_steps=0, horizon_s="10min"))
    rule.fit(448)  # window: 12 samples
    found = None
    for i in range(1, 21):  # 2 MB a step, a step every 0.1 s: 20 MB/s against 3 GB left
        found = found or rule.check(Window(memory=[memory(5 * i, 500 + 10 * i, 0.5 * i, 3000)]))
    # a run's first 50 steps are its start-up, not projected: the window fills (12 samples,
    # 110 MB), with the projection in the message
    assert found is not None and found.step == 60
    assert "run out in about 2.5 min (within the 10 min horizon)" in found.message


def test_a_leak_after_the_start_up_is_projected_from_half_the_window() -> None:
    rule = MemoryGrowthRule(MemoryGrowthRule.Settings(warmup_steps=0, horizon_s="10min"))
    rule.fit(448)  # window: 12 samples
    found = None
    for i in range(1, 21):  # the same 2 MB a step, from step 55 on
        found = found or rule.check(Window(memory=[memory(50 + 5 * i, 500 + 10 * i, 0.5 * i,
                                                          3000)]))
    assert found is not None and found.step == 80  # 6 samples in (half the window), OOM soon


def test_growth_late_in_a_run_that_ends_before_the_projected_oom_does_not_stop_it() -> None:
    def fires_at(planned: int, available_mb: float, first: int = 0) -> int | None:
        rule = MemoryGrowthRule(MemoryGrowthRule.Settings(warmup_steps=0))
        rule.fit(planned)
        for i in range(1, 12):  # every 6 steps of 10 ms: 0.8 MB is 13 MB/s, 8 MB by 11 samples
            window = Window(memory=[memory(first + 6 * i, 350 + 0.8 * i, 0.06 * i,
                                           available_mb)], planned_steps=planned, step_s=0.01)
            found = rule.check(window)
            if found is not None:
                return found.step
        return None

    # a 72-step run's start-up growth: OOM projected in ~27 min, the run ends in 0.06 s
    assert fires_at(72, 22_000) is None
    # in a long run the same 8 MB in its first 66 steps is its start (the monitor's first
    # samples' buffers), not a trend to project over half an hour: several runs in one process
    # each stopped at their start
    assert fires_at(5000, 22_000) is None
    # the same growth after the start-up: a leak, stopped within the horizon
    assert fires_at(5000, 22_000, first=60) == 126
    # late in the run, but memory runs out before its end (0.5 MB left at 13 MB/s: 0.04 s)
    assert fires_at(72, 0.5) == 66


def test_slow_growth_with_room_to_spare_waits_for_the_growth_threshold() -> None:
    rule = MemoryGrowthRule(MemoryGrowthRule.Settings(warmup_steps=0))
    steps = [rule.check(Window(memory=[memory(100 * i, 500 + 8 * i, 60.0 * i, 20_000)]))
             for i in range(1, 11)]
    assert all(f is None for f in steps[:-1]) and steps[-1] is not None
    assert "beyond the 30 min horizon" in steps[-1].message  # fired for 72 MB of growth


def layers(step: int) -> Window:
    return Window(steps=[step], loss=[1.0], layers=[LayerSample(step, {}, 0.0)], lr=0.0,
                  peak_lr=0.1, planned_steps=2000)


def test_a_learning_rate_zeroed_mid_run_is_caught_and_a_schedule_ending_at_zero_is_not() -> None:
    rule = UpdateRatioRule(UpdateRatioRule.Settings(warmup_steps=0))
    found = [rule.check(layers(step)) for step in (400, 450, 500)]
    assert found[-1] is not None and "learning rate is 0 at step 500" in found[-1].message
    rule = UpdateRatioRule(UpdateRatioRule.Settings(warmup_steps=0))
    assert all(rule.check(layers(step)) is None for step in (1850, 1900, 1950, 2000))


def test_memory_is_sampled_by_time_when_steps_are_slow() -> None:
    clock = FakeClock()
    stats = StepStats(MonitorSettings(memory_every_s=30), clock=clock)
    stats.fit(1_000_000)  # memory every 100 steps by count
    for step in range(1, 11):
        clock.advance(5.0)  # 5 s steps
        stats.step_end(step, 1.0)
    assert len(stats.take_window().memory) == 1  # 50 s since the start: one sample by time
    stats.fit(2000)
    assert stats.memory_every == 20


def _flat_after(rule: LossNotDecreasingRule, start: float, floor: float, steps: int,
                start_loss: float | None = None) -> int | None:
    """Feed a loss falling from ``start`` to ``floor`` by step 300 and flat (±1% noise) after;
    the step the rule fires at, or None. ``start_loss``: the run's start, as the monitor
    measures it (Window.start_loss)."""
    import random

    noise = random.Random(0)
    for first in range(1, steps + 1, 10):
        losses = [max(floor, start - (start - floor) * s / 300) * noise.uniform(0.99, 1.01)
                  for s in range(first, first + 10)]
        found = rule.check(Window(steps=list(range(first, first + 10)), loss=losses,
                                  start_loss=start_loss))
        if found is not None:
            return found.step
    return None


def test_a_converged_plateau_is_not_a_stuck_loss_but_a_loss_that_never_fell_is() -> None:
    settings = LossNotDecreasingRule.Settings(warmup_steps=0, window=100, patience=3)
    # fell from 2.2 to 0.85, then flat for 2,700 steps: converged (healthy_sparse_eval)
    assert _flat_after(LossNotDecreasingRule(settings), 2.2, 0.85, 3000) is None
    # 2% below where it started, then flat: stuck (shuffled labels)
    found = _flat_after(LossNotDecreasingRule(settings), 2.32, 2.28, 3000)
    assert found is not None and found <= 800
    # fell from 3.15 within the first steps, before the rule's warm-up ended (a bigram
    # table): the run's start says so, where the first block would say "flat since 1.15"
    fast = LossNotDecreasingRule(LossNotDecreasingRule.Settings(warmup_steps=100, window=100,
                                                                patience=3))
    assert _flat_after(fast, 1.15, 1.14, 3000) is not None  # no start given: judged stuck
    fast = LossNotDecreasingRule(LossNotDecreasingRule.Settings(warmup_steps=100, window=100,
                                                                patience=3))
    assert _flat_after(fast, 1.15, 1.14, 3000, start_loss=3.15) is None
    # with max_progress 1, every plateau is judged (the rule as it was)
    judge_all = LossNotDecreasingRule.Settings(warmup_steps=0, window=100, patience=3,
                                               max_progress=1)
    assert _flat_after(LossNotDecreasingRule(judge_all), 2.2, 0.85, 3000) is not None



def zero_lr(step: int, lr: float = 0.0) -> Window:
    return Window(steps=[step - 9, step], loss=[1.0, 1.0], lr=lr, max_lr=lr, peak_lr=0.1,
                  planned_steps=2000)


def test_a_zero_learning_rate_read_at_two_checks_stops_without_waiting_for_layer_samples() -> None:
    rule = UpdateRatioRule(UpdateRatioRule.Settings(warmup_steps=0))
    assert rule.check(zero_lr(310)) is None  # one read of 0: a schedule may touch it once
    found = rule.check(zero_lr(320))
    assert found is not None and found.step == 320 and found.since == 310
    assert "learning rate of every param group is 0 at step 320" in found.message
    rule = UpdateRatioRule(UpdateRatioRule.Settings(warmup_steps=0))
    assert [rule.check(w) for w in (zero_lr(310), zero_lr(320, 0.05), zero_lr(330))] == [None] * 3
    # a group still learning (max_lr > 0) moves weights: not this finding
    window = zero_lr(340)
    window.max_lr = 0.01
    assert rule.check(window) is None
    # the schedule's own end at 0 (the last tenth of the run) is not a bug
    assert all(rule.check(zero_lr(step)) is None for step in (1850, 1900, 1950))


def test_memory_sampling_sized_at_a_check_counts_from_the_step_the_run_is_at() -> None:
    stats = StepStats(MonitorSettings())
    for step in range(1, 11):
        stats.step_end(step, 1.0)
    stats.take_window()  # the monitor sizes right after a check has taken the steps
    stats.fit(448, step=10)  # memory every 5 steps from now (was: not before step 100)
    for step in range(11, 21):
        stats.step_end(step, 1.0)
    assert [m.step for m in stats.take_window().memory] == [15, 20]


def _sampled(step: int, planned: int, every: int = 20, ratio: float = 5e-8,
             lr: float = 1e-6) -> Window:
    """A check's window on a run of ``planned`` steps with a layer sample every ``every``: the
    update ratio of a learning rate 1000x too small, everything dead or vanishing."""
    return Window(steps=[step], loss=[2.3], lr=lr, peak_lr=lr, max_lr=lr, planned_steps=planned,
                  sample_every=every,
                  layers=[LayerSample(step, {"0.weight": 1e-12, "2.weight": 1e-2}, ratio)],
                  activations=[ActivationSample(step, {"1": 1.0}, {"1": "dead"})])


def _fires_at(rule: Rule, planned: int, every: int = 20, **kw: float) -> int | None:
    rule.fit(planned)
    for step in range(every, 40 * every, every):
        found = rule.check(_sampled(step, planned, every, **kw))
        if found is not None:
            return found.step
    return None


def test_layer_rules_fire_within_about_a_tenth_of_a_short_run_but_never_on_one_sample() -> None:
    # samples every 20 steps: 3 in a row took 60 steps of a 336-step run (18%); 2 fit in a
    # tenth-ish, and one sample alone is never a verdict
    for cls in (DeadActivationsRule, UpdateRatioRule):
        assert _fires_at(cls(), 336) == 40, cls.name
        # a long run: 3 samples fit in a tenth (update_ratio's warm-up, 100 steps, skips one)
        third = 400 if cls is UpdateRatioRule else 300
        assert _fires_at(cls(), 100_000, every=100) == third, cls.name
        # a patience you set is kept, on a short run too
        assert _fires_at(cls(cls.Settings(patience=4)), 336) == 80, cls.name
    rule = DeadActivationsRule()
    rule.fit(336)
    assert rule.check(_sampled(20, 336)) is None  # one sample: no verdict
    # vanishing_gradient keeps its 3: a tiny BERT's attention query and key gradients sit at
    # 1e-5 of its classifier's for its first hundreds of steps while it learns
    assert _fires_at(VanishingGradientRule(), 336) == 60


def test_update_ratio_judges_the_first_samples_but_waits_while_the_learning_rate_rises() -> None:
    # a short run: the first sample (step 20) is judged (the warm-up is a fortieth of the run)
    assert _fires_at(UpdateRatioRule(), 448) == 40
    # a linear warm-up of the learning rate: small updates by design, not judged while it rises
    rule = UpdateRatioRule()
    rule.fit(448)
    found = [rule.check(_sampled(step, 448, lr=1e-6 * step)) for step in range(20, 200, 20)]
    assert found == [None] * len(found)
    # flat from step 200 on: judged again, 2 samples in a row
    assert [rule.check(_sampled(step, 448, lr=2e-4)) for step in (200, 220)] == [None, None]
    found = rule.check(_sampled(240, 448, lr=2e-4))
    assert found is not None and found.step == 240


def test_attention_weights_with_a_small_share_of_the_gradient_are_not_vanishing() -> None:
    """A tiny BERT (AdamW) gives its attention query and key weights 1e-5 to 8e-5 of its
    classifier's gradient RMS while it learns; a 12-layer sigmoid stack starves its first
    layer at 1e-10 of the largest."""
    def layers(step: int, first: float) -> Window:
        return Window(steps=[step], loss=[0.6], layers=[LayerSample(step, {
            "layer.1.attention.self.query.weight": first, "classifier.weight": 0.025}, 1e-3)])

    rule = VanishingGradientRule()
    assert all(rule.check(layers(step, 2.5e-7)) is None for step in range(20, 320, 20))
    found = [rule.check(layers(step, 2.5e-12)) for step in (320, 340, 360)]
    assert found[:2] == [None, None] and found[2] is not None and "1e-10" in found[2].message
