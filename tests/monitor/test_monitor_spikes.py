"""loss_spike: an outlier's update is skipped, a lasting spike is rolled back, then stopped."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import prudent
from prudent.checkpoint import Checkpointer
from prudent.checkpoint.settings import CheckpointSettings
from prudent.kernel.events import Event
from prudent.monitor import Monitor, register_rule, unregister_rule
from prudent.monitor.base import Finding, Rule, Window
from prudent.monitor.rules import LossSpikeRule
from prudent.store.database import Store
from prudent.testing import StopAtStep, make_settings, tiny_loader, tiny_model
from tests.monitor.test_monitor_component import _saved


def steady(first: int, count: int, level: float = 1.0) -> Window:
    losses = [level * (1 + 0.05 * math.sin(step)) for step in range(first, first + count)]
    return Window(steps=list(range(first, first + count)), loss=losses)  # type: ignore[arg-type]


def test_outliers_are_skipped_within_a_budget_per_window() -> None:
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0, max_skips=2))
    assert not rule.skips(1, 100.0)  # no baseline yet
    rule.check(steady(1, 100))
    assert not rule.skips(101, 1.04) and rule.skips(101, 5.0) and rule.skips(102, 5.0)
    assert not rule.skips(103, 5.0)  # two per 128 steps: more is a spike that lasts
    assert rule.skips(101 + 128, 5.0)
    assert "standard deviations above its mean" in rule.describe_skip(101, 5.0)


def test_a_lasting_spike_fires_with_the_step_it_began() -> None:
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    rule.check(steady(1, 100))
    spike = steady(101, 10, level=3.0)
    finding = rule.check(spike)
    assert finding is not None and finding.since == 101 and finding.step == 105
    assert "for 5 updated steps since step 101" in finding.message
    assert rule.check(steady(111, 10)) is None  # the baseline from before the spike stayed


def test_a_loss_near_its_floor_whose_hard_batches_run_five_in_a_row_is_no_spike() -> None:
    """Lightning's digits MLP at a loss of ~0.04 (per-batch deviation ~0.04): 5 steps at
    0.10-0.40, 2.5-10x the mean but mostly within 3 deviations, were rolled back to step 1."""
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    floor = [0.04 + 0.04 * math.sin(1.7 * step) ** 3 for step in range(1, 129)]  # mean ~0.04
    rule.check(Window(steps=list(range(1, 129)), loss=floor))  # type: ignore[arg-type]
    hard = [0.14, 0.12, 0.10, 0.13, 0.11, 0.04]  # 2.5-3.5x the mean, under mean + 3 deviations
    assert rule.check(Window(steps=list(range(129, 135)), loss=hard)) is None  # type: ignore[arg-type]
    spike = [0.9, 0.8, 0.9, 0.85, 0.9]  # the same 5 steps, 20 deviations up: a spike
    finding = rule.check(Window(steps=list(range(135, 140)), loss=spike))  # type: ignore[arg-type]
    assert finding is not None and finding.since == 135


def test_a_floors_lone_hard_batches_join_the_baseline_so_five_ordinary_steps_are_no_spike() -> None:
    """The toy DDP classifier of tests/e2e/scripts/ddp_train.py, 600 epochs under torchrun, at
    a loss of ~0.01 with a lone hard batch at 0.06-0.3 every few steps. Held out of the
    baseline, those left it a mean of 0.011 and a small deviation, and five steps at
    0.03-0.058 in a row stopped the healthy run at step 340 (no rollback under torchrun)."""
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    floor = [0.2 if step % 10 == 0 else 0.004 + 0.003 * math.sin(1.7 * step) ** 2
             for step in range(1, 257)]
    rule.check(Window(steps=list(range(1, 257)), loss=floor))  # type: ignore[arg-type]
    blip = [0.054, 0.049, 0.056, 0.032, 0.058, 0.005]
    assert rule.check(Window(steps=list(range(257, 263)), loss=blip)) is None  # type: ignore[arg-type]
    spike = [2.0, 2.1, 2.0, 2.2, 2.1]  # far above the hard batches too: a spike
    finding = rule.check(Window(steps=list(range(263, 268)), loss=spike))  # type: ignore[arg-type]
    assert finding is not None and finding.since == 263


def run_with(home: Path, spoil: Any, steps_per_epoch: int = 32, epochs: int = 6,
             checkpoints: bool = False, **monitor: Any) -> tuple[prudent.Run, list[dict[str, Any]],
                                                               dict[int, bool]]:
    settings = make_settings(home, monitor={"max_check_every_steps": 10, **monitor})
    components: list[Any] = [Monitor(settings.monitor, stream=io.StringIO())]
    if checkpoints:
        components.append(Checkpointer(CheckpointSettings(every="20steps", keep=2)))
    run = prudent.init(name="spike", settings=settings, exit_on_stop=False, components=components)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    moved: dict[int, bool] = {}
    loader = tiny_loader(num_samples=steps_per_epoch * 8, batch_size=8)
    with run:
        for _ in run.epochs(epochs):
            for x, y in run.batches(loader):
                step = run.state.step + 1
                loss = F.cross_entropy(model(spoil(step, x)), y)
                run.backward(loss)
                before = model[0].weight.detach().clone()
                opt.step()
                moved[step] = not torch.equal(before, model[0].weight)
                opt.zero_grad()
                run.step(loss=loss)
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    events = [e for e in store.events(run.id) if e["kind"] in ("monitor", "rule", "checkpoint")]
    store.close()
    return run, events, moved


def test_the_update_of_an_outlier_batch_is_skipped(tmp_path: Path) -> None:
    run, events, moved = run_with(tmp_path / ".prudent",
                                  lambda step, x: x * -1000 if step == 150 else x)
    assert run.status == "completed"
    assert not moved[150] and moved[149] and moved[151]  # only that update was skipped
    (skip,) = [e for e in events if e["name"] == "skipped_update"]
    assert skip["step"] == 150 and "its optimizer update was skipped" in skip["message"]


def test_the_loss_is_judged_before_backward_so_most_steps_skip_the_gradient_hook(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Reading the loss just after the forward pass costs less than after the backward pass
    has filled the caches; the gradient hook then runs only on the steps that measure norms."""
    hooked: list[int] = []
    gradient_hook = Monitor.on_after_backward

    def counted(self: Monitor, run: Any, loss: Any) -> None:
        hooked.append(run.state.step + 1)
        gradient_hook(self, run, loss)

    monkeypatch.setattr(Monitor, "on_after_backward", counted)
    run, events, moved = run_with(tmp_path / ".prudent",
                                  lambda step, x: x * -1000 if step == 150 else x)
    assert not moved[150] and moved[149] and moved[151]
    assert 0 < len(hooked) < 6 * 32 // 2  # the norms' steps, not all 192


def test_a_loop_that_announces_only_after_backward_has_every_outlier_judged(
        tmp_path: Path) -> None:
    """An adapter's loop (Keras, Lightning) emits AFTER_BACKWARD only: the skip is judged
    there on every step, not only on the first window's (b5b62e7 stopped listening)."""
    settings = make_settings(tmp_path / ".prudent", monitor={"max_check_every_steps": 10})
    run = prudent.init(name="adapter", settings=settings, exit_on_stop=False,
                       components=[Monitor(settings.monitor, stream=io.StringIO())])
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    moved: dict[int, bool] = {}
    ctx = run.context
    with run:
        for _ in run.epochs(6):
            for x, y in run.batches(tiny_loader(num_samples=32 * 8, batch_size=8)):
                step = run.state.step + 1
                loss = F.cross_entropy(model(x * -1000 if step == 150 else x), y)
                loss.backward()
                ctx.emit(Event.AFTER_BACKWARD, loss)  # what an adapter's hook does
                before = model[0].weight.detach().clone()
                opt.step()
                moved[step] = not torch.equal(before, model[0].weight)
                opt.zero_grad()
                run.step(loss=loss)
    assert not moved[150] and moved[149] and moved[151]


def test_a_lasting_spike_is_rolled_back_past_its_data(tmp_path: Path) -> None:
    run, events, _ = run_with(tmp_path / ".prudent",
                              lambda step, x: -x if 101 <= step <= 112 else x,
                              checkpoints=True, actions={"rollback": {"skip_batches": 8}})
    rollbacks = [e for e in events if e["name"] == "rollback"]
    # 8 batches skipped by each rollback. The corrupted stretch is steps 101-112 by the step
    # counter, which goes on: when checks fall early (a loaded machine), the 8 skipped batches
    # end before step 112 and the rest of the stretch is a second spike, rolled back too
    assert len(rollbacks) in (1, 2), rollbacks
    assert run.status == "completed" and run.state.step == 6 * 32 - 8 * len(rollbacks)
    rollback = rollbacks[0]
    assert rollback["payload"]["checkpoint_step"] == 96  # the newest from before step 101 (epoch end)
    assert rollback["payload"]["spike_step"] == 101
    assert "skipping the next 8 batches" in rollback["message"]
    assert any(e["name"] == "restored" for e in events)


def test_a_rollback_never_goes_further_back_than_max_steps_back_it_stops_instead(
        tmp_path: Path) -> None:
    # checkpoints every 20 steps: the newest before the spike at step 101 is step 96, 5 back
    run, events, _ = run_with(tmp_path / ".prudent",
                              lambda step, x: -x if 101 <= step <= 112 else x,
                              checkpoints=True, actions={"rollback": {"max_steps_back": 4}})
    assert (run.status, run.stop_reason) == ("stopped", "rule:loss_spike")
    (fired,) = [e for e in events if e["kind"] == "rule"]
    assert "no checkpoint from within 4 steps before step 101" in fired["payload"]["outcome"]
    assert not any(e["name"] in ("rollback", "restored") for e in events)


def test_after_a_rollback_beyond_its_baseline_the_spike_baseline_is_learnt_again() -> None:
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    rule.check(steady(1, 128, level=0.1))
    rule.rewound(40)  # back to weights the window's losses were made by: the baseline stays
    assert rule.skip_above < 0.2
    rule.rewound(500)  # further back than the window: the restored weights' loss is no spike
    assert rule.skip_above == math.inf and len(rule.recent) == 0
    assert rule.check(steady(129, 10, level=2.3)) is None


def test_after_max_rollbacks_the_next_spike_stops_the_run(tmp_path: Path) -> None:
    run, events, _ = run_with(tmp_path / ".prudent",
                              lambda step, x: -x if 101 <= step <= 112 else x,
                              checkpoints=True, actions={"rollback": {"max_rollbacks": 0}})
    assert (run.status, run.stop_reason) == ("stopped", "rule:loss_spike")
    (fired,) = [e for e in events if e["kind"] == "rule"]
    assert "0 rollbacks already" in fired["payload"]["outcome"]


def test_a_calm_window_is_judged_as_the_step_by_step_pass_would() -> None:
    """The shortcut for windows with no step near factor x the moving mean, and the inlined
    pass over the others, leave the rule exactly where _judge step by step does (moving
    window, threshold, streak, findings), on windows that are calm, that spike, that skip,
    that go negative and that hold one hard batch among calm ones."""
    import random

    rng = random.Random(0)
    fast = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    slow = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    slow._calm = lambda finite: False  # type: ignore[method-assign]

    def one_by_one(finite: list[tuple[int, float]]) -> Finding | None:  # _judge, unrolled
        skipped = set(slow.skipped)
        for step, loss in finite:
            finding = slow._judge(step, loss, step in skipped)
            if finding is not None:
                return finding
        return None

    slow._judge_each = one_by_one  # type: ignore[method-assign]
    calm_windows, step = 0, 1
    for i in range(60):
        level = {7: 3.0, 8: 3.0, 20: -1.0, 33: 2.5}.get(i, 1.0)
        losses = [level * (1 + 0.1 * rng.random()) for _ in range(25)]
        if i % 4 == 1:  # one batch at 2.3x among calm ones
            losses[rng.randrange(25)] *= 2.3
        if i == 40:
            losses[3] = float("nan")
        window = Window(steps=list(range(step, step + 25)), loss=losses)  # type: ignore[arg-type]
        if i % 9 == 5:  # an outlier skipped before its update, as the monitor asks
            for rule in (fast, slow):
                rule.skips(step + 2, 1e9)
        calm_windows += fast._calm(window.finite_losses())
        a, b = fast.check(window), slow.check(Window(steps=window.steps, loss=window.loss))
        assert (a and (a.step, a.since, a.message)) == (b and (b.step, b.since, b.message))
        assert list(fast.recent) == list(slow.recent) and fast.streak == slow.streak
        assert fast.skip_above == slow.skip_above or (math.isinf(fast.skip_above)
                                                      and math.isinf(slow.skip_above))
        step += 25
    assert 30 < calm_windows < 60  # both paths were taken


class _SpikeWindow(Rule):
    """Fires once, at the first check whose window holds the spiked steps (the same check as
    loss_spike's rollback): a stand-in for another rule that sees the spike."""

    name = "spike_window"
    needs = frozenset({"steps"})

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.fired = False

    def check(self, window: Window) -> Finding | None:
        if self.fired or not any(101 <= step <= 112 for step in window.steps):
            return None
        self.fired = True
        return Finding(window.steps[-1], 1.0, 0.0, "the spike's window")


class _SmoothingSpikeWindow(_SpikeWindow):
    name = "smoothing_spike_window"

    def rolled_back(self) -> None:  # a rule that smooths the loss (divergence)
        pass


def test_a_rollback_drops_the_same_checks_findings_of_rules_that_smooth_the_loss_only(
        tmp_path: Path) -> None:
    spoil = lambda step, x: -x if 101 <= step <= 112 else x  # noqa: E731
    for cls, stopped in ((_SmoothingSpikeWindow, False), (_SpikeWindow, True)):
        register_rule(cls)
        try:
            # one skip, then the spike's updated steps count: rolled back in the check that
            # holds the spiked steps (the default budget would skip the whole spike)
            run, events, _ = run_with(tmp_path / cls.name / ".prudent", spoil, checkpoints=True,
                                      actions={"rollback": {"skip_batches": 8}},
                                      rules={"loss_spike": {"max_skips": 1}})
        finally:
            unregister_rule(cls.name)
        assert any(e["name"] == "rollback" for e in events)
        # a smoothed loss judged the losses the rollback took back: dropped; another finding
        # of the same check (a gradient that explodes at too high a learning rate) still stops
        assert (run.status == "stopped") is stopped
        assert (run.stop_reason == f"rule:{cls.name}") is stopped


def test_outliers_that_keep_coming_window_after_window_are_trained_not_skipped() -> None:
    """A model that has learnt most of its data meets its hard samples again each epoch: the
    first few are skipped, then they are the data's own tail (prudent.monitor.tail)."""
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    rule.check(steady(1, 128, level=0.001))
    hard = list(range(200, 1000, 50))  # one hard batch every 50 steps, at ~200 deviations up
    skipped = [step for step in hard if rule.skips(step, 0.15)]
    # until three of them, older than 128 steps, lie over more than 128 steps
    assert skipped == [200, 250, 300, 350, 400, 450]
    assert rule.tail_step == 950
    said = rule.describe_tail(950, 0.15)
    assert "has a heavy tail here" in said and "trained" in said
    assert rule.skips(1001, 5.0)  # a corrupted batch far above the tail is still skipped


def test_a_burst_of_outliers_never_makes_a_tail() -> None:
    """Ten corrupted batches in a row, twice: each skipped (the budget allowing), for each
    burst's outliers fall within one window."""
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0, max_skips=10))
    rule.check(steady(1, 128))
    first = [step for step in range(200, 210) if rule.skips(step, 50.0)]
    second = [step for step in range(600, 610) if rule.skips(step, 50.0)]
    assert first == list(range(200, 210)) and second == list(range(600, 610))
    assert rule.tail_step == -1


def hard_sample_run(home: Path, monkeypatch: Any, run_id: str,
                    stop_at: int | None = None) -> dict[str, Any]:
    """The digits MLP of benchmarks/adapters_within_fit.py for 4,000 steps: one training sample
    lifts its batch's loss to 0.15-0.2 among 0.0003 whenever it comes."""
    for name, value in (("KMP_DUPLICATE_LIB_OK", "True"), ("KMP_INIT_AT_FORK", "FALSE"),
                        ("PRUDENT_RUN_ID", run_id)):
        monkeypatch.setenv(name, value)  # (the first two: what scikit-learn's OpenMP sets)
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:1437]
    x = torch.tensor(images, dtype=torch.float32)[order] / 16.0
    y = torch.tensor(labels, dtype=torch.long)[order]
    steps = 4000
    repeat = -(-steps * 32 // len(x))
    data = torch.utils.data.TensorDataset(torch.cat([x] * repeat)[:steps * 32],
                                          torch.cat([y] * repeat)[:steps * 32])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
    settings = make_settings(home)
    components: list[Any] = [Monitor(settings.monitor, stream=io.StringIO()),
                             Checkpointer(CheckpointSettings(every="off"))]
    if stop_at:
        components.append(StopAtStep(stop_at))
    run = prudent.init(name="hard-sample", settings=settings, exit_on_stop=False,
                       components=components)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(1):
            for xb, yb in run.batches(loader):
                loss = F.cross_entropy(model(xb), yb)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
    with torch.no_grad():
        worst = F.cross_entropy(model(x), y, reduction="none").max().item()
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    events = store.events(run.id)
    store.close()
    return {"status": run.status, "step": run.state.step, "worst": worst,
            "model": model.state_dict(),
            "skipped": [e["step"] for e in events if e["name"] == "skipped_update"],
            "trained": [e for e in events if e["name"] == "outlier_trained"]}


def test_a_converged_run_learns_its_hard_sample_instead_of_skipping_it_for_ever(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Each of the hard sample's updates was skipped (74 skipped updates): it stayed
    misclassified at a loss of 4.8. Now the few first are skipped, then its loss is one the
    baseline has seen (or the data's tail), and it is learnt as it is without prudent."""
    run = hard_sample_run(tmp_path / ".prudent", monkeypatch, "hard")
    assert run["status"] == "completed"
    assert run["worst"] < 0.1  # every training sample learnt (4.8 when its updates were skipped)
    assert 0 < len(run["skipped"]) <= 12 and max(run["skipped"]) < 2000  # not for ever


def test_a_run_resumed_after_its_skips_is_the_run_never_stopped(
        tmp_path: Path, monkeypatch: Any) -> None:
    home = tmp_path / ".prudent"
    reference = hard_sample_run(home, monkeypatch, "reference")
    first = hard_sample_run(home, monkeypatch, "victim", stop_at=1140)
    assert (first["status"], first["step"]) == ("stopped", 1140) and first["skipped"]
    resumed = hard_sample_run(home, monkeypatch, "victim")
    assert (resumed["status"], resumed["step"]) == ("completed", 4000)
    assert resumed["skipped"] == reference["skipped"]
    # said once, by the process that saw the tail form, not again by the resumed one
    assert [e["step"] for e in resumed["trained"]] == [e["step"] for e in reference["trained"]]
    assert all(torch.equal(a, b) for a, b in zip(reference["model"].values(),
                                                   resumed["model"].values()))


def test_a_resumed_run_knows_the_tail_its_checkpoint_saw() -> None:
    rule = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    rule.check(steady(1, 128, level=0.001))
    for step in range(200, 600, 50):
        rule.skips(step, 0.15)
    state = torch.load(_saved(rule.state_dict()), weights_only=True)
    resumed = LossSpikeRule(LossSpikeRule.Settings(warmup_steps=0))
    resumed.load_state_dict(state)
    assert not resumed.skips(650, 0.15) and resumed.tail_step == 650
    assert rule.skips(650, 0.15) == resumed.skips(650, 0.15) is False
