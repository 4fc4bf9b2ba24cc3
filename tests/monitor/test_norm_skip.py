"""exploding_gradient's skip: the first step of a burst of bad batches has its update skipped
before ``optimizer.step()`` when its gradient norm is far above the median of the norms before
it, without waiting for a second step; which updates are skipped never depends on the timing
(the stride the norm is measured at, where checks fell)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import prudent
from prudent.monitor.stats import grid_after, on_grid
from prudent.store.database import Store
from prudent.testing import StopAtStep, make_settings, tiny_loader, tiny_model

# loss_spike is off: what skips an update here is the gradient norm alone
NO_LOSS_SPIKE = {"loss_spike": {"enabled": False}}


def run_with_bad_batches(tmp_path: Path, bad: set[int], *, check_every: int = 10,
                         stop_at: int | None = None, norm_every: int | str = "auto",
                         spoil: str = "inputs") -> dict[str, Any]:
    """A healthy tiny run whose ``bad`` steps are spoiled: ``inputs`` x50; ``flipped``: x50 and
    the labels flipped (a tiny classifier that has learnt its rule gets the x50 inputs right
    with confidence, and a near zero gradient, late in the run); ``gradient``: the loss as it
    was, its gradient 1000x larger (a term worth 0 whose gradient is not)."""
    settings = make_settings(tmp_path, monitor={"check_every_steps": check_every,
                                                "max_check_every_steps": 50,
                                                "grad_norm_every_steps": norm_every,
                                                "rules": NO_LOSS_SPIKE},
                             checkpoint={"every": "off"})
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run = prudent.init(name="norm-skip", settings=settings, exit_on_stop=False)
    if stop_at:
        run.context.add_component(StopAtStep(stop_at))
    run.attach(model=model, optimizer=opt)
    loader = tiny_loader(num_samples=8 * 50, batch_size=8)
    unchanged = {}
    with run:
        for _ in run.epochs(8):
            for x, y in run.batches(loader):
                step = run.state.step + 1
                if step in bad and spoil != "gradient":
                    x, y = x * 50, (1 - y if spoil == "flipped" else y)
                loss = F.cross_entropy(model(x), y)
                if step in bad and spoil == "gradient":
                    weight = model[0].weight
                    loss = loss + 1000 * (weight.sum() - weight.sum().detach())
                run.backward(loss)
                before = [p.detach().clone() for p in model.parameters()]
                opt.step()
                opt.zero_grad()
                if step in bad:
                    unchanged[step] = all(torch.equal(b, p) for b, p in
                                          zip(before, model.parameters()))
                run.step(loss=loss)
    store = Store(f"sqlite:///{tmp_path / 'prudent.db'}")
    try:
        skips = [e for e in store.events(run.id) if e["name"] == "skipped_update"]
    finally:
        store.close()
    return {"status": run.status, "step": run.state.step, "skips": skips,
            "unchanged": unchanged, "model": model.state_dict()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_single_bad_batch_has_its_update_skipped_by_its_gradient_norm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # step 150 is neither a grid step nor after one: its loss jump has its norm judged
    assert not on_grid(150)
    monkeypatch.setenv("PRUDENT_RUN_ID", "single")
    result = run_with_bad_batches(tmp_path, {150})
    assert (result["status"], result["step"]) == ("completed", 400)
    assert result["unchanged"] == {150: True}  # the weights did not move at that step
    (skip,) = result["skips"]
    payload = skip["payload"]
    assert (skip["step"], payload["rule"]) == (150, "exploding_gradient")
    assert payload["grad_norm"] > 10 * payload["median"] > 0
    assert skip["message"].startswith("gradient norm ")
    assert "its median" in skip["message"] and "update was skipped" in skip["message"]


def test_a_grid_step_is_judged_without_a_loss_jump(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a gradient 1000x too large under a loss as it was: judged on a grid step (measured
    # whatever the stride), not on the step after it (no loss jump asks for its norm)
    step = grid_after(200)
    assert not on_grid(step + 1)
    monkeypatch.setenv("PRUDENT_RUN_ID", "grid")
    result = run_with_bad_batches(tmp_path, {step, step + 1}, norm_every=1000, spoil="gradient")
    skipped = [s["step"] for s in result["skips"]]
    assert skipped[0] == step and step + 1 not in skipped  # (what it wrecked is judged after)
    assert result["unchanged"] == {step: True, step + 1: False}


@pytest.mark.slow  # three runs
def test_which_updates_are_skipped_does_not_depend_on_the_timing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # checks every 10 steps or every 23, the norm every step or every 7: the same skips
    bad = {97, 150, 151, 152, 233, 318}
    outcomes = []
    for name, check_every, norm_every in (("a", 10, "auto"), ("b", 23, 7), ("c", 10, 1)):
        monkeypatch.setenv("PRUDENT_RUN_ID", name)
        outcomes.append(run_with_bad_batches(tmp_path, bad, check_every=check_every,
                                             norm_every=norm_every, spoil="flipped"))
    skipped = [[(s["step"], s["message"]) for s in o["skips"]] for o in outcomes]
    assert skipped[0] == skipped[1] == skipped[2]
    assert {s for s, _ in skipped[0]} == bad
    assert same(outcomes[0]["model"], outcomes[1]["model"])
    assert same(outcomes[0]["model"], outcomes[2]["model"])


@pytest.mark.slow  # three runs each
@pytest.mark.parametrize("stop_at", [120, 151, 245])
def test_a_run_resumed_anywhere_skips_the_same_updates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_at: int) -> None:
    # before the burst, inside it (150-152) and after it, between checks
    bad = {150, 151, 152, 233}
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = run_with_bad_batches(tmp_path, bad, spoil="flipped")
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    first = run_with_bad_batches(tmp_path, bad, stop_at=stop_at, spoil="flipped")
    assert (first["status"], first["step"]) == ("stopped", stop_at)
    resumed = run_with_bad_batches(tmp_path, bad, check_every=23, spoil="flipped")
    assert (resumed["status"], resumed["step"]) == ("completed", reference["step"])
    # the store holds the run's events of both attempts
    steps = [(s["step"], s["message"]) for s in resumed["skips"]]
    assert steps == [(s["step"], s["message"]) for s in reference["skips"]]
    assert {s for s, _ in steps} == bad
    assert same(reference["model"], resumed["model"])


def test_norms_that_keep_coming_window_after_window_are_trained_not_skipped() -> None:
    """A hard sample's norm, met again each epoch, is the data's own tail once its outliers
    lie over more than 128 steps (prudent.monitor.tail); an exploding norm far above it is
    still skipped."""
    from prudent.monitor.rules import ExplodingGradientRule

    rule = ExplodingGradientRule(ExplodingGradientRule.Settings(warmup_steps=0))
    for step in range(32, 32 * 6, 32):
        rule.skips(step, 0.03, grid=True)  # the median's grid steps
    hard = list(range(200, 1000, 50))
    skipped = [step for step in hard if rule.skips(step, 1.3, grid=False)]
    # the budget (4 per 128 steps) allows each; the tail forms once three are old enough
    assert skipped == [200, 250, 300, 350, 400, 450] and rule.tail_step == 950
    assert "heavy tail" in rule.describe_tail(950, 1.3)
    assert rule.skips(1001, 30.0, grid=False)  # far above the tail: an explosion
    assert not rule.skips(1002, 30.0, grid=False, judge=False)  # the loss's verdict stands


def test_with_no_skip_the_checks_form_the_tail_so_two_hard_batches_in_a_row_stop_nothing() -> None:
    """Under torchrun (or on a GPU) no norm is judged before its update, so no skip noted an
    outlier and no tail formed: the toy DDP classifier at its floor (median norm 0.0046) was
    stopped at step 1793 of 9,600 for two hard batches in a row at 11x. The checks note the
    outliers then; an explosion far above the tail still stops the run."""
    from prudent.monitor.base import Window
    from prudent.monitor.rules import ExplodingGradientRule

    rule = ExplodingGradientRule(ExplodingGradientRule.Settings(warmup_steps=0))
    rule.outliers_from_checks = True  # what the monitor sets when it cannot skip

    def window(first: int, norms: list[float]) -> Window:
        steps = list(range(first, first + len(norms)))
        return Window(steps=steps, loss=[0.5] * len(norms), grad_norm=norms)  # type: ignore[arg-type]

    for first in range(1, 1201, 100):  # a hard batch alone every 40 steps
        norms = [0.06 if step % 40 == 0 else 0.005 for step in range(first, first + 100)]
        assert rule.check(window(first, norms)) is None
    assert rule.check(window(1201, [0.06, 0.06] + [0.005] * 8)) is None  # two in a row
    finding = rule.check(window(1211, [5.0, 5.0, 0.005]))
    assert finding is not None and finding.step == 1212
