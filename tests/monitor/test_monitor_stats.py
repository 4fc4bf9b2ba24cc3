"""StepStats on real tiny models: the numbers are right, and they stay on the device until read."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from prudent.monitor import MonitorSettings
from prudent.monitor.stats import StepStats
from prudent.testing import FakeClock, tiny_model


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 8, generator=generator), torch.randint(0, 2, (16,), generator=generator)


def one_step(stats: StepStats, model: nn.Module, opt: torch.optim.Optimizer, step: int,
             scaler: torch.amp.GradScaler | None = None, reported: float | None = None) -> bool:
    """One training step watched by ``stats`` (told ``reported`` as the loss, if given); True
    when a window is due."""
    x, y = batch(step)
    loss = F.cross_entropy(model(x), y)
    (scaler.scale(loss) if scaler else loss).backward()
    stats.after_backward(step)
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad()
    return stats.step_end(step, loss if reported is None else reported)


def make(every: int = 1, sample: int = 50, **objects: object) -> tuple[StepStats, nn.Module, torch.optim.Optimizer]:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = StepStats(MonitorSettings(grad_norm_every_steps=every, sample_every_steps=sample,
                                      check_every_steps=10))
    stats.attach({"model": model, "optimizer": opt, **objects})
    return stats, model, opt


def test_global_gradient_norm_matches_torch() -> None:
    stats, model, opt = make()
    expected = []
    for step in range(1, 4):
        x, y = batch(step)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        stats.after_backward(step)
        expected.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item())
        opt.step()
        opt.zero_grad()
        stats.step_end(step, loss)
        assert isinstance(stats._norms[step], float)  # CPU memory: read at once, no wait
    window = stats.take_window()
    assert window.steps == [1, 2, 3]
    assert window.grad_norm == pytest.approx(expected, rel=1e-5)
    assert all(isinstance(v, float) and math.isfinite(v) for v in window.loss)
    assert stats.take_window().steps == []  # a window is handed over once


def test_norms_are_measured_every_n_steps_when_fixed() -> None:
    stats, model, opt = make(every=3)
    for step in range(1, 10):
        one_step(stats, model, opt, step)
    window = stats.take_window()
    assert [s for s, g in zip(window.steps, window.grad_norm) if g is not None] == [3, 6, 9]
    assert max(g for g in window.grad_norm if g) < 3 * min(g for g in window.grad_norm if g)


def test_a_jump_in_the_norm_makes_a_sparse_stride_measure_every_step() -> None:
    stats, model, opt = make(every=4)
    for step in range(1, 21):
        if step == 8:
            with torch.no_grad():
                model[0].weight.mul_(50)  # something blows up at step 8
        one_step(stats, model, opt, step)
    window = stats.take_window()
    measured = [s for s, g in zip(window.steps, window.grad_norm) if g is not None]
    # step 9 confirms the jump (still 3x above the norms before it): every step from there
    assert measured == [4, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]


def test_a_one_batch_jump_in_the_norm_costs_one_more_norm_not_a_burst() -> None:
    stats, model, opt = make(every=4)
    for step in range(1, 21):
        x, y = batch(step)
        odd = step == 8  # one odd batch: its gradients 50x, its update not made (the model
        loss = F.cross_entropy(model(x), y) * (50.0 if odd else 1.0)  # is as it was)
        loss.backward()
        stats.after_backward(step)
        if not odd:
            opt.step()
        opt.zero_grad()
        stats.step_end(step, loss)
    window = stats.take_window()
    measured = [s for s, g in zip(window.steps, window.grad_norm) if g is not None]
    # the jump at 8 is looked at again at 9, where the norm is back: the stride goes on
    assert measured == [4, 8, 9, 13, 17]
    assert not stats.bursting


def test_a_burst_ends_once_the_norm_is_back_where_it_was() -> None:
    stats, model, opt = make(every=8)
    measured = []
    for step in range(1, 41):
        x, y = batch(step)
        odd = step in (16, 17)  # two hard batches in a row: 50x gradients, their updates not
        loss = F.cross_entropy(model(x), y) * (50.0 if odd else 1.0)  # made (as if skipped)
        loss.backward()
        stats.after_backward(step)
        if step == 18:
            assert stats.bursting  # the jump was confirmed at 17
        if not odd:
            opt.step()
        opt.zero_grad()
        if stats.step_end(step, loss):
            window = stats.take_window()
            measured += [s for s, g in zip(window.steps, window.grad_norm) if g is not None]
    # every step from the confirmation until four norms in a row are calm again (18-21),
    # then the stride again: not the burst's 16 steps
    assert measured == [8, 16, 17, 18, 19, 20, 21, 29, 37]
    assert not stats.bursting


def test_an_explosion_that_keeps_climbing_is_followed_past_one_bursts_length() -> None:
    stats, model, opt = make(every=4)  # a burst: 8 steps
    measured = []
    for step in range(1, 41):
        if 8 <= step <= 14:
            with torch.no_grad():
                model[0].weight.mul_(4)  # the norm jumps again at every step until 14
        if one_step(stats, model, opt, step):
            window = stats.take_window()
            measured += [s for s, g in zip(window.steps, window.grad_norm) if g is not None]
    # a burst from the confirmation at 13, made longer by each jump confirmed in it: 8
    # steps after the last one, not after the first
    assert set(range(13, 24)) <= set(measured)


@pytest.mark.parametrize("jump, due", [(True, [10]), (False, [])])
def test_while_a_jump_is_followed_checks_come_at_the_shortest_interval(
        jump: bool, due: list[int]) -> None:
    stats, model, opt = make(every=4)
    stats.check_every = 100  # stretched: checks were dear
    checked = []
    for step in range(1, 31):
        if step == 8 and jump:
            with torch.no_grad():
                model[0].weight.mul_(50)
        if one_step(stats, model, opt, step):
            checked.append(step)
            stats.take_window()
    assert checked == due  # every check_every_steps (10) while the burst lasts (steps 8-16)


def test_a_jump_in_the_loss_measures_the_next_norm_whatever_the_stride() -> None:
    stats, model, opt = make(every=50)
    measured = []
    for step in range(1, 31):
        # a noisy batch at 3x the level is ignored; an explosion's 10x is looked at closer
        if one_step(stats, model, opt, step, reported=0.5 * {14: 3, 18: 10}.get(step, 1)):
            window = stats.take_window()  # the level is known from the first window on
            measured += [s for s, g in zip(window.steps, window.grad_norm) if g is not None]
    assert measured == [19]


@pytest.mark.parametrize("budget, host_loss, stride", [
    (0.01, False, 4), (0.01, True, 16),
    # a tight budget: every 80 steps wanted; on a device the stride stops at 32, with every
    # loss on the host (the early warning) at 64 (the interleaved A/B's 0.7 ms CPU step took
    # 192 norms of ~70 us in 6,000 steps at 32)
    (0.0005, False, 32), (0.0005, True, 64)])
def test_auto_stride_keeps_the_norm_within_the_budget(budget: float, host_loss: bool,
                                                      stride: int) -> None:
    clock = FakeClock()
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = StepStats(MonitorSettings(overhead_budget=budget), clock=clock)
    stats.attach({"model": model, "optimizer": opt})
    original = stats._tensor_norms

    def expensive() -> tuple[object, object]:
        clock.advance(40e-6)  # a norm costs 40 us...
        return original()

    def step(i: int) -> None:
        x, y = batch(i)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        stats.after_backward(i)
        opt.step()
        opt.zero_grad()
        stats.step_end(i, loss if host_loss else None)

    stats._tensor_norms = expensive  # type: ignore[method-assign]
    for i in range(1, 11):
        step(i)
        clock.advance(1e-3)  # ...of a 1 ms step: every step would be 4%
    stats.take_window()
    # 40 us / 4 = 10 us = 1% of the step; with the loss on the host at every step (the early
    # warning), a norm dearer than 1% of a step is never taken more often than every 16 steps
    assert stats.norm_every == stride
    for i in range(11, 11 + stride * 10, stride):
        step(i)
        clock.advance(1.0)  # slow steps: measure every step again
    stats.take_window()
    assert stats.norm_every == 1


def test_dear_checks_come_rarer_but_never_past_the_maximum() -> None:
    clock = FakeClock()
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = StepStats(MonitorSettings(overhead_budget=0.01, grad_norm_every_steps=1), clock=clock)
    stats.attach({"model": model, "optimizer": opt})
    for step in range(1, 11):
        one_step(stats, model, opt, step)
        clock.advance(1e-3)  # 1 ms steps
    stats.take_window()
    stats.check_took(300e-6)  # a 300 us check every 10 steps would be 3% of the time
    assert stats.check_every == 30  # 300 us / 30 steps = 1%
    stats.check_took(0.5)
    assert stats.check_every == 100  # capped: rules must still see the loss often
    stats.check_took(1e-6)
    assert stats.check_every == 10  # cheap again: back to check_every_steps
    assert stats.step_end(11, float("nan"))  # a NaN on the host is judged at once


def test_layer_sample_gives_weight_gradient_rms_and_the_exact_update_ratio() -> None:
    stats, model, opt = make(sample=2)
    one_step(stats, model, opt, 1)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch(2)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    stats.after_backward(2)
    rms = {n: (p.grad.norm() / math.sqrt(p.numel())).item()
           for n, p in model.named_parameters() if p.dim() >= 2}
    opt.step()
    opt.zero_grad()
    stats.step_end(2, loss)
    (sample,) = stats.take_window().layers
    assert sample.step == 2 and sample.grad_rms == pytest.approx(rms, rel=1e-5)
    delta = math.sqrt(sum(((p.detach() - b) ** 2).sum().item()
                          for p, b in zip(model.parameters(), before)))
    weight = math.sqrt(sum((b ** 2).sum().item() for b in before))
    assert sample.update_ratio == pytest.approx(delta / weight, rel=1e-4)


def test_update_ratio_follows_a_parameter_whose_storage_was_replaced() -> None:
    stats, model, opt = make(sample=2)
    for step in (1, 2, 3):
        one_step(stats, model, opt, step)
    first = model[0].weight
    first.data = first.data.clone()  # what model.to() does: new storage, same Parameter
    before = [p.detach().clone() for p in model.parameters()]
    one_step(stats, model, opt, 4)
    samples = stats.take_window().layers
    delta = math.sqrt(sum(((p.detach() - b) ** 2).sum().item()
                          for p, b in zip(model.parameters(), before)))
    weight = math.sqrt(sum((b ** 2).sum().item() for b in before))
    assert [s.step for s in samples] == [2, 4]
    assert samples[1].update_ratio == pytest.approx(delta / weight, rel=1e-4)


def test_update_ratio_of_a_large_weight_comes_from_a_small_strided_sample() -> None:
    model = nn.Linear(512, 512)  # 262144 weights: sampled, not copied
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    stats = StepStats(MonitorSettings(sample_every_steps=1))
    stats.attach({"model": model, "optimizer": opt})
    model(torch.randn(4, 512)).pow(2).mean().backward()
    stats.after_backward(1)
    copied = sum(t.numel() for t in stats._layers[0].before or [])
    assert copied < 2 * 4096 + 512
    opt.step()
    stats.step_end(1, None)
    (sample,) = stats.take_window().layers
    assert sample.update_ratio is not None and 0 < sample.update_ratio < 1


def test_activation_probe_finds_dead_relus_and_removes_its_hooks() -> None:
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    nn.init.constant_(model[0].bias, -100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = StepStats(MonitorSettings(sample_every_steps=2))
    stats.attach({"model": model, "optimizer": opt})
    for step in (1, 2, 3):  # batches of 16: the sample at step 2 spans steps 2 and 3
        one_step(stats, model, opt, step)
        assert bool(model[1]._forward_hooks) == (step < 3)  # hooks only while sampling
    (sample,) = stats.take_window().activations
    assert sample.step == 2 and sample.inactive == {"1": 1.0} and sample.kinds == {"1": "dead"}


def test_a_unit_is_dead_when_no_example_fired_it_in_any_layout() -> None:
    """(N, F), (N, T, F) and convolutions' (N, C, H, W): a unit fires when any of its values
    is above 0; a NaN is non_finite's to name, so its unit is not called dead."""
    from prudent.monitor.activations import _alive_units

    dense = torch.tensor([[0.0, 2.0, -1.0, float("nan")], [0.0, 0.0, 3.0, -1.0]])
    assert _alive_units(dense, "dead").tolist() == [False, True, True, True]
    tokens = torch.zeros(2, 3, 4)
    tokens[1, 2, 1] = 0.5
    assert _alive_units(tokens, "dead").tolist() == [False, True, False, False]
    maps = torch.zeros(2, 3, 4, 4)
    maps[0, 2, 3, 3] = 1.0
    assert _alive_units(maps, "dead").tolist() == [False, False, True]


def test_small_batches_extend_an_activation_sample_until_enough_examples() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.Sigmoid(), nn.Linear(4, 2))
    stats = StepStats(MonitorSettings(sample_every_steps=100))
    stats.attach({"model": model})
    stats.step_end(99, None)  # arms the hooks for step 100
    for step in range(100, 108):  # 4 examples a step: 32 after 8 steps
        model(torch.randn(4, 8)).sum().backward()
        stats.step_end(step, None)
        assert stats.activations.armed == (step < 107)
    (sample,) = stats.take_window().activations
    assert sample.step == 100 and sample.kinds == {"1": "saturated"}


def test_grad_scaler_norms_are_unscaled() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    stats, model, opt = make(scaler=scaler)
    x, y = batch(1)
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    stats.after_backward(1)
    expected = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item() / 1024
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    stats.step_end(1, loss)
    window = stats.take_window()
    assert window.amp and window.grad_norm[0] == pytest.approx(expected, rel=1e-5)


def test_floats_and_missing_losses_pass_through_and_lr_peak_is_tracked() -> None:
    stats, _, opt = make()
    stats.step_end(1, 2.5)
    stats.step_end(2, None)
    window = stats.take_window()
    assert window.loss == [2.5, None] and window.grad_norm == [None, None]
    assert (window.lr, window.peak_lr) == (0.1, 0.1)
    opt.param_groups[0]["lr"] = 0.01
    stats.step_end(3, torch.tensor(1.0))
    window = stats.take_window()
    assert (window.lr, window.peak_lr) == (0.01, 0.1) and window.in_schedule_tail(0.2)
