"""What each action does to a real run and a real optimizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import prudent
from prudent.monitor.actions import (
    CaptureAction,
    Firing,
    PruneAction,
    ReduceLRAction,
    StopAction,
    build_actions,
)
from prudent.monitor.base import Finding
from prudent.monitor.settings import ActionSettings, ReduceLRSettings
from prudent.store.database import Store
from prudent.testing import make_settings, tiny_model

FINDING = Finding(40, 9.0, 3.0, "loss diverged at step 40")


def firing(at: int = 42, name: str = "divergence") -> Firing:
    return Firing(name, FINDING, at)


def new_run(home: Path) -> prudent.Run:
    return prudent.init(name="act", settings=make_settings(home, monitor={"enabled": False}),
                        exit_on_stop=False)


@pytest.mark.parametrize(("action", "reason", "code"), [(StopAction(), "rule:divergence", 3),
                                                        (PruneAction(), "pruned", 5)])
def test_stop_and_prune_unwind_the_run_with_their_reason(home: Path, action: object, reason: str,
                                                         code: int) -> None:
    run = new_run(home)
    with run:
        run.step(loss=1.0)
        action.apply(run.context, firing())  # type: ignore[attr-defined]
        run.step(loss=1.0)
        pytest.fail("the step after a stop request must raise StopRun")
    assert (run.status, run.stop_reason, run.exit_code) == ("stopped", reason, code)


def test_capture_records_a_request_with_the_step_and_the_reason(home: Path) -> None:
    run = new_run(home)
    with run:
        assert CaptureAction().apply(run.context, firing()) == "capture requested"
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    (event,) = [e for e in store.events(run.id) if e["kind"] == "capture_requested"]
    store.close()
    assert (event["name"], event["step"], event["message"]) == ("divergence", 42, FINDING.message)
    assert event["payload"] == {"reason": "rule:divergence", "finding_step": 40}


def test_reduce_lr_scales_every_group_and_the_schedule_then_cools_down(home: Path) -> None:
    model = tiny_model()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                           {"params": model[2].parameters(), "lr": 0.01}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    run = new_run(home)
    run.attach(model=model, optimizer=opt, scheduler=sched)
    action = ReduceLRAction(ReduceLRSettings(factor=0.5, cooldown_steps=100, min_lr=0.004))
    with run:
        assert action.apply(run.context, firing(at=42)) == "learning rate 0.1 -> 0.05"
        assert action.apply(run.context, firing(at=100)).startswith("reduce_lr in cooldown (reduced at step 42)")
        assert action.apply(run.context, firing(at=142)) == "learning rate 0.05 -> 0.025"
        opt.step()
        sched.step()  # LambdaLR recomputes lr from base_lrs: the reduction must survive it
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.025, 0.004])
    assert action.state_dict() == {"last_step": 142}


def test_reduce_lr_stops_at_its_floor_and_says_so(home: Path) -> None:
    opt = torch.optim.SGD(tiny_model().parameters(), lr=1e-3)
    run = new_run(home)
    run.attach(optimizer=opt)
    action = ReduceLRAction(ReduceLRSettings(factor=0.1, cooldown_steps=0, min_lr=1e-3))
    with run:
        assert action.apply(run.context, firing()) == "reduce_lr: the learning rate is already at its floor 0.001"
    assert opt.param_groups[0]["lr"] == 1e-3


def test_reduce_lr_without_an_optimizer_says_what_to_attach(home: Path) -> None:
    run = new_run(home)
    with run:
        assert "run.attach(optimizer=...)" in ReduceLRAction().apply(run.context, firing())


def test_reduce_lr_reaches_an_optimizer_an_adapter_shows_but_never_attaches(home: Path) -> None:
    """Lightning's and Hugging Face's optimizers reach the components through an ATTACH event
    (the adapter's watch), not run.attach (the framework saves them): reduce_lr did nothing."""
    from prudent.kernel.events import Event
    from prudent.monitor import Monitor

    opt = torch.optim.SGD(tiny_model().parameters(), lr=0.1)
    run = prudent.init(name="act", settings=make_settings(home), exit_on_stop=False)
    (monitor,) = [c for c in run.context.components if isinstance(c, Monitor)]
    with run:
        run.context.emit(Event.ATTACH, {"optimizer": opt})
        assert "optimizer" not in run.context.objects
        assert monitor.actions["reduce_lr"].apply(run.context, firing()) == "learning rate 0.1 -> 0.05"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_every_action_name_has_an_action() -> None:
    from prudent.monitor.base import ACTION_NAMES

    assert sorted(build_actions(ActionSettings())) == sorted(ACTION_NAMES)
