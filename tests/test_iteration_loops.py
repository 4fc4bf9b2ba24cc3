"""Loops without epochs or a DataLoader (nanoGPT's): run.steps, gradient accumulation, and an
exact resume whichever helper the loop uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import prudent
from prudent.kernel.events import Component
from prudent.testing import StopAtStep, make_settings
from prudent.wiring.config import ProjectSettings


class BackwardLog(Component):
    name = "backward_log"

    def __init__(self, weight: Any = None) -> None:
        self.seen: list[tuple[int, float]] = []
        self.before: list[tuple[int, float, float | None]] = []  # (step, loss, gradient then)
        self.weight = weight

    def on_before_backward(self, ctx: Any, loss: Any) -> None:
        grad = None if self.weight is None or self.weight.grad is None else self.weight.grad.item()
        self.before.append((ctx.state.step + 1, float(loss.detach()), grad))

    def on_after_backward(self, ctx: Any, loss: Any) -> None:
        self.seen.append((ctx.state.step + 1, float(loss.detach())))


def test_steps_yields_from_the_restored_step_to_n(settings: ProjectSettings) -> None:
    run = prudent.init(name="steps", settings=settings, exit_on_stop=False, components=[])
    run.context.state.step = 5  # as a checkpoint restores it
    seen = []
    with run:
        for it in run.steps(8):
            seen.append(it)
            run.step()
    assert seen == [5, 6, 7] and run.state.step == 8 and run.state.num_steps == 8


def test_steps_stops_at_the_smoke_limit_and_refuses_a_body_without_step(
        settings: ProjectSettings) -> None:
    run = prudent.init(name="limit", settings=settings, exit_on_stop=False, components=[])
    run.context.step_limit = 3
    with run:
        assert [it for it in run.steps(100) if run.step() is None] == [0, 1, 2]
    run = prudent.init(name="no-step", settings=settings, exit_on_stop=False, components=[])
    with pytest.raises(RuntimeError, match="ended without run.step"), run:
        for _ in run.steps(3):
            pass


def test_micro_steps_run_the_gradient_hooks_once_per_step_with_the_summed_loss(
        settings: ProjectSettings) -> None:
    weight = torch.ones(1, requires_grad=True)
    log = BackwardLog(weight)
    run = prudent.init(name="accum", settings=settings, exit_on_stop=False, components=[log])
    with run:
        for _ in run.steps(3):
            for micro in (1.0, 2.0):
                run.backward((weight * micro).sum())
            run.step()
    # the first step learns that two backward calls make a step; then once, after the second
    assert log.seen == [(1, 1.0), (1, 3.0), (2, 3.0), (3, 3.0)]
    assert weight.grad is not None and weight.grad.item() == 9.0
    # the loss hooks: the same summed losses, each before its micro-step's gradient was added
    # (the gradients accumulate over the steps: 1, 3, then 3 more per step)
    assert log.before == [(1, 1.0, None), (1, 3.0, 1.0), (2, 3.0, 4.0), (3, 3.0, 7.0)]


def _draws(home: Path, run_id: str, monkeypatch: pytest.MonkeyPatch, loop: str,
           stop_at: int | None = None) -> list[float]:
    """A loop drawing its batches from the global generator, as nanoGPT does."""
    monkeypatch.setenv("PRUDENT_RUN_ID", run_id)
    settings = make_settings(home, checkpoint={"every": "2steps"})
    run = prudent.init(name="draws", settings=settings, exit_on_stop=False,
                       components=None)
    if stop_at is not None:
        run.context.add_component(StopAtStep(stop_at))
    torch.manual_seed(0)  # the script seeds itself at every start
    weight = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([weight], lr=0.1)
    run.attach(weight=weight, optimizer=opt)
    drawn: list[float] = []
    with run:
        if loop == "steps":
            iterations: Any = run.steps(8)
        elif loop == "counter":
            iterations = range(run.state.step, 8)
        else:
            iterations = range(8)  # counts for itself, never reads run.state
        for _ in iterations:
            x = torch.randn(3)
            drawn.append(float(x.sum()))
            run.backward((weight * x).sum())
            opt.step()
            opt.zero_grad()
            run.step()
    return drawn


@pytest.mark.parametrize("loop", ["steps", "counter"])
def test_a_loop_without_run_batches_resumes_with_the_generators_restored(
        home: Path, monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    reference = _draws(home, "reference", monkeypatch, loop)
    first = _draws(home, "victim", monkeypatch, loop, stop_at=4)
    resumed = _draws(home, "victim", monkeypatch, loop)
    assert first == reference[:4] and resumed == reference[4:]


def test_a_resumed_loop_that_counts_from_zero_is_warned(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _draws(home, "victim", monkeypatch, "own", stop_at=4)
    with pytest.warns(UserWarning, match="resumed at step 4.*run.steps"):
        _draws(home, "victim", monkeypatch, "own")
