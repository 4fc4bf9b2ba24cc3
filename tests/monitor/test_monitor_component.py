"""The Monitor component inside a real Run, on real (tiny) training."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import prudent
from prudent.monitor import (
    Finding,
    Monitor,
    MonitorSettings,
    Window,
    rule,
    unregister_rule,
)
from prudent.store.database import Store
from prudent.testing import make_settings, tiny_loader, tiny_model


def monitored_run(home: Path, stream: io.StringIO | None = None, **monitor: Any) -> tuple[prudent.Run, Monitor]:
    # microsecond steps would make checks rarer (max_check_every_steps); pin them at 10
    settings = make_settings(home, monitor={"max_check_every_steps": 10, **monitor})
    component = Monitor(settings.monitor, stream=stream or io.StringIO())
    run = prudent.init(name="mon", settings=settings, exit_on_stop=False, components=[component])
    return run, component


def train(run: prudent.Run, epochs: int = 5, poison_at: int | None = None, lr: float = 0.1,
          after_epoch: Callable[[int], None] | None = None, run_backward: bool = True
          ) -> torch.optim.Optimizer:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    run.attach(model=model, optimizer=opt)
    with run:
        for epoch in run.epochs(epochs):
            for x, y in run.batches(tiny_loader(num_samples=512, batch_size=16)):
                if run.state.step + 1 == poison_at:
                    x = x.clone()
                    x[0, 0] = float("nan")
                loss = F.cross_entropy(model(x), y)
                if run_backward:
                    run.backward(loss)
                else:  # the loop's own backward: the kernel's loss watch sees nothing
                    loss.backward()
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
            if after_epoch is not None:
                after_epoch(epoch)
    return opt


def rule_events(home: Path, run: prudent.Run) -> list[dict[str, Any]]:
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    try:
        return [e for e in store.events(run.id) if e["kind"] not in ("lifecycle",)
                and (e["kind"], e["name"]) != ("monitor", "blind")]
    finally:
        store.close()


def test_healthy_training_fires_no_rule(home: Path) -> None:
    run, monitor = monitored_run(home)
    train(run, epochs=10)  # 320 steps
    assert run.status == "completed" and run.state.step == 320
    assert monitor.firings == [] and rule_events(home, run) == []


def test_a_nan_loss_on_the_host_stops_the_run_at_its_own_step_with_its_reason(
        home: Path) -> None:
    console = io.StringIO()
    run, _ = monitored_run(home, console)
    train(run, poison_at=25)  # a CPU loss is read every step: no need to wait for the check
    assert (run.status, run.stop_reason, run.state.step) == ("stopped", "rule:non_finite", 25)
    (event,) = rule_events(home, run)
    assert (event["kind"], event["name"], event["step"]) == ("rule", "non_finite", 25)
    assert event["payload"] == {"value": "nan", "threshold": None, "action": ["stop"],
                                "outcome": "stopping the run", "detected_at": 25}
    assert event["message"].startswith("loss is NaN at step 25 (last finite ")
    assert console.getvalue() == (f"prudent | {run.id} | rule non_finite: {event['message']} "
                                  "-> stopping the run\n")


@pytest.mark.parametrize("run_backward", [True, False], ids=["run.backward", "loss.backward"])
def test_the_monitor_sleeps_through_steps_the_loss_watch_sees_and_still_stops_a_nan_at_once(
        home: Path, run_backward: bool) -> None:
    run, monitor = monitored_run(home)
    called: list[int] = []

    def counted(handler: Callable[..., None]) -> Callable[..., None]:
        if getattr(handler, "__self__", None) is not monitor:
            return handler

        def count(ctx: Any, *args: Any) -> None:
            called.append(ctx.state.step)
            handler(ctx, *args)
        return count
    run.context.wrap_handlers(counted, [prudent.kernel.events.Event.STEP_END])
    train(run, epochs=10, poison_at=237, run_backward=run_backward)
    assert (run.stop_reason, run.state.step) == ("rule:non_finite", 237)  # at its own step
    assert rule_events(home, run)[0]["payload"]["detected_at"] == 237
    if run_backward:  # the kernel keeps the losses and flags the NaN: called on some steps
        # only (checks every 10 steps and memory every 5 on this short run: ~70 calls)
        assert 237 in called and len(called) < 237 / 2, len(called)
    else:  # no loss watch: every step's loss is looked at by the monitor itself
        assert called == list(range(1, 238))


def test_validation_that_worsens_while_training_improves_stops_as_overfitting(home: Path) -> None:
    run, _ = monitored_run(home)
    val = iter([1.0, 0.8, 0.7, 0.75, 0.8, 0.9, 1.0, 1.1])
    train(run, epochs=8, after_epoch=lambda epoch: run.log(val_loss=next(val)))
    # stopped at the 6th evaluation (step 192), once that epoch's end has run: 6 epochs done
    assert run.stop_reason == "rule:overfitting" and run.state.epoch == 6
    (event,) = rule_events(home, run)
    assert "val_loss 0.9 at step 192 is worse than its best 0.7 (step 96) for 3 evaluations" \
        in event["message"] and "while the training loss fell" in event["message"]


@pytest.fixture
def every_window_rule() -> Iterator[str]:
    @rule("always", action="alert", cooldown_steps=100)
    def always(window: Window, settings: Any) -> Finding | None:
        if not window.steps:
            return None
        step = window.steps[-1]
        return Finding(step, 1.0, 0.0, f"always fires (step {step})")

    yield "always"
    unregister_rule("always")


def test_an_alert_keeps_training_and_cooldown_mutes_repeats(home: Path, every_window_rule: str) -> None:
    run, monitor = monitored_run(home)
    train(run, epochs=10)
    assert run.status == "completed"
    assert [f.detected_at for f in monitor.firings] == [10, 110, 210, 310]


@pytest.fixture
def broken_rule() -> Iterator[None]:
    @rule("broken", action="alert")
    def broken(window: Window, settings: Any) -> Finding | None:
        raise ZeroDivisionError("oops")

    yield
    unregister_rule("broken")


def test_a_rule_that_raises_is_switched_off_and_training_goes_on(home: Path, broken_rule: None) -> None:
    run, monitor = monitored_run(home)
    train(run, epochs=2)
    assert run.status == "completed" and "broken" not in monitor.rules
    (event,) = rule_events(home, run)
    assert event["name"] == "rule_error" and "ZeroDivisionError('oops')" in event["message"]


def test_a_plateau_can_lower_the_learning_rate_instead_of_stopping(home: Path) -> None:
    run, _ = monitored_run(home, rules={"loss_not_decreasing": {
        "action": "reduce_lr", "window": 20, "patience": 2, "warmup_steps": 0,
        "min_improvement": 0.5}}, actions={"reduce_lr": {"factor": 0.5, "cooldown_steps": 50}})
    opt = train(run, epochs=5)
    assert run.status == "completed"
    events = [e for e in rule_events(home, run) if e["name"] == "loss_not_decreasing"]
    lowered = [e for e in events if e["payload"]["outcome"].startswith("learning rate")]
    assert lowered and lowered[0]["payload"]["outcome"] == "learning rate 0.1 -> 0.05"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** len(lowered))


def test_monitor_state_rides_in_the_run_state_and_survives_weights_only_load(home: Path) -> None:
    run, monitor = monitored_run(home)
    train(run, epochs=4)
    buffer = io.BytesIO()
    torch.save(run.context.state_dict()["components"]["monitor"], buffer)
    buffer.seek(0)
    restored = Monitor(MonitorSettings())
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.state_dict() == monitor.state_dict()
    divergence = restored.rules["divergence"]
    assert divergence.best is not None and math.isfinite(divergence.best)  # type: ignore[attr-defined]


def test_the_skipped_updates_not_yet_checked_ride_in_the_state(home: Path) -> None:
    # a checkpoint between a skipped update and the next check: the resumed run's rules must
    # still know that step's loss measured an update the weights never saw
    monitor = Monitor(MonitorSettings())
    monitor._repaired = [150, 151]
    restored = Monitor(MonitorSettings())
    restored.load_state_dict(torch.load(_saved(monitor.state_dict()), weights_only=True))
    assert restored._repaired == [150, 151]
    assert restored.state_dict() == monitor.state_dict()


def _saved(state: dict[str, Any]) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_where_the_run_started_is_the_median_of_its_first_five_losses_and_is_kept(
        home: Path) -> None:
    run, monitor = monitored_run(home, rules={"non_finite": {"action": ["alert"]}})
    losses = [9.0, 3.0, float("nan"), 2.0, 2.5, 1.0, 0.5, 0.4]  # a NaN is no start, 9 no median
    with run:
        for value in run.steps(len(losses)):
            run.step(loss=losses[value])
    assert monitor.start_loss == 2.5  # of 9, 3, 2, 2.5, 1
    restored = Monitor(MonitorSettings())
    restored.load_state_dict(monitor.state_dict())
    assert restored.start_loss == 2.5  # a resumed run's start is the run's, not its restart's


def test_disabled_monitoring_adds_no_component(home: Path) -> None:
    run = prudent.init(name="off", settings=make_settings(home, monitor={"enabled": False}),
                       exit_on_stop=False)
    with run:
        pass
    assert not any(isinstance(c, Monitor) for c in run.context.components)
    run2 = prudent.init(name="on", settings=make_settings(home), exit_on_stop=False)
    with run2:
        pass
    assert any(isinstance(c, Monitor) for c in run2.context.components)


def test_checks_come_at_least_every_fiftieth_of_a_short_run_whatever_the_step_time(
        home: Path) -> None:
    settings = make_settings(home)  # max_check_every_steps left to its default (100)
    component = Monitor(settings.monitor, stream=io.StringIO())
    run = prudent.init(name="mon", settings=settings, exit_on_stop=False, components=[component])
    train(run, epochs=15)  # 32 steps an epoch: 480 planned, microsecond steps
    assert component.stats.max_check_every == 10  # 480 // 50 is 9: never below check_every_steps
    assert component.stats.check_every <= 10
    long = Monitor(make_settings(home, monitor={"max_check_every_steps": 40}).monitor)
    long.stats.max_check_every = 40
    assert long.settings.max_check_every_steps == 40  # a value set by hand is kept as it is


def test_a_long_run_of_fast_steps_may_space_its_checks_up_to_a_fiftieth_of_it(
        home: Path) -> None:
    """Beyond the default ceiling of 100 steps: a check's ~0.3 ms on 1 ms steps would
    otherwise take more than its 0.2% budget on every long run."""
    settings = make_settings(home)
    component = Monitor(settings.monitor, stream=io.StringIO())
    run = prudent.init(name="mon", settings=settings, exit_on_stop=False, components=[component])
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    x, y = next(iter(tiny_loader(num_samples=16, batch_size=16)))
    with run:
        for _ in run.steps(7_000):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
            if run.state.step == 30:
                break
    assert component.stats.max_check_every == 140


@pytest.fixture
def two_rules_at_once() -> Iterator[None]:
    def fires_at(name: str, action: str) -> None:
        @rule(name, action=action)
        def check(window: Window, settings: Any) -> Finding | None:
            steps = [s for s in window.steps if s >= 30]
            return Finding(steps[0], 9.0, 1.0, f"{name} found it") if steps else None

    fires_at("first_sign", "alert")
    fires_at("second_sign", "stop")
    yield
    unregister_rule("first_sign")
    unregister_rule("second_sign")


def test_rules_that_fire_in_one_check_are_one_decision(home: Path,
                                                       two_rules_at_once: None) -> None:
    run, _ = monitored_run(home)
    train(run, epochs=2)
    assert run.stop_reason == "rule:second_sign"
    events = rule_events(home, run)
    (decision,) = [e for e in events if e["name"] == "decision"]
    payload = decision["payload"]
    assert [f["rule"] for f in payload["findings"]] == ["first_sign", "second_sign"]
    assert payload["decided_by"] == "second_sign" and "stop" in payload["findings"][1]["outcome"]
    assert "2 rules fired at step 30: second_sign decided" in decision["message"]
    assert "with it: first_sign (first_sign found it)" in decision["message"]
    # each rule's own event is still there, for what reads them one by one
    assert {e["name"] for e in events if e["kind"] == "rule"} == {"first_sign", "second_sign"}
