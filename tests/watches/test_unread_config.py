"""A --set or tuner key the script does not read is named: on the console, in the record, and
as a failed trial under the tuner (``unread_config.py``)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import torch

import prudent
from prudent.launch.spec import LaunchSpec, TrialSpec
from prudent.store.database import Store
from prudent.watches.unread_config import UnreadConfigWatch
from prudent.wiring.components import default_components
from prudent.wiring.config import ProjectSettings

CONFIG = {"lr": 1e-3, "max_iters": 200, "model": {"hidden": 8, "act": "relu"}}


def _start(settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch, given: dict[str, Any],
           trial: int | None = None) -> tuple[prudent.Run, io.StringIO]:
    """A run whose --set values are ``given``, watched by the component alone."""
    import json

    monkeypatch.setenv("PRUDENT_SET", json.dumps(given))
    console = io.StringIO()
    watch = UnreadConfigWatch(given, trial=trial, stream=console)
    run = prudent.init(name="cfg", config=CONFIG, settings=settings, exit_on_stop=False,
                       components=[watch])
    return run, console


def _loop(run: prudent.Run, num_steps: int, read_at: dict[int, Callable[[], Any]] | None = None,
          epochs: int | None = None) -> None:
    """``num_steps`` steps (per epoch, when ``epochs``); ``read_at[step]()`` before that step."""
    model = torch.nn.Linear(2, 1)
    read_at = read_at or {}

    def one_step(it: int) -> None:
        if it in read_at:
            read_at[it]()
        run.backward(model(torch.ones(1, 2)).sum())
        run.step()

    with run:
        if epochs is None:
            for it in run.steps(num_steps):
                one_step(it)
        else:
            for _ in run.epochs(epochs):
                for _ in range(num_steps):
                    one_step(run.state.step)


def _unread_events(settings: ProjectSettings, run: prudent.Run) -> list[dict[str, Any]]:
    store = Store.open(settings.store)
    try:
        return [e for e in store.events(run.id) if (e["kind"], e["name"]) == ("config", "unread")]
    finally:
        store.close()


def test_a_set_key_never_read_is_warned_after_one_percent_of_the_planned_steps(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    run, console = _start(settings, monkeypatch, {"lr": 0.5, "max_iters": 200})
    max_iters = run.config["max_iters"]  # read; lr never is
    _loop(run, max_iters, read_at={5: lambda: run.config["lr"]})  # read too late
    (event,) = _unread_events(settings, run)
    assert event["step"] == 2 and event["payload"]["keys"] == ["lr"]
    assert event["payload"]["values"] == {"lr": 0.5}
    assert console.getvalue() == (
        f"prudent | {run.id} | warning: --set lr=0.5 was not read from run.config by step 2 (1% "
        "of the 200 planned steps): the run records it but trains on the script's own value. "
        'Read it from run.config (run.config["lr"]) or, for configurator-style globals '
        "(nanoGPT), add globals().update(run.config) after prudent.init (a key read only after "
        "training, such as an output path, can be read before the loop)\n")
    assert run.status == "completed"  # a warning, not a stop, outside the tuner


def test_globals_update_reads_every_key_so_nothing_is_warned(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    run, console = _start(settings, monkeypatch, {"lr": 0.5, "model.hidden": 16})
    script_globals: dict[str, Any] = {"run": run}
    exec("globals().update(run.config)", script_globals)  # nanoGPT's line, at module level
    assert script_globals["lr"] == 0.5 and script_globals["model"]["hidden"] == 16
    _loop(run, 10)
    assert _unread_events(settings, run) == [] and console.getvalue() == ""


def test_a_nested_key_is_read_only_when_its_own_value_is(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    run, console = _start(settings, monkeypatch, {"model.hidden": 16})
    assert run.config["model"]["act"] == "relu"  # the section and another key: not hidden
    _loop(run, 10)
    (event,) = _unread_events(settings, run)
    assert event["payload"]["keys"] == ["model.hidden"]
    assert 'Read it from run.config (run.config["model"]["hidden"])' in console.getvalue()


def test_an_epoch_loop_is_judged_at_the_end_of_its_first_epoch(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    run, console = _start(settings, monkeypatch, {"lr": 0.5, "max_iters": 3})
    run.config.get("max_iters")
    _loop(run, 4, epochs=3, read_at={6: lambda: run.config["lr"]})  # in epoch 2: too late
    (event,) = _unread_events(settings, run)
    assert event["step"] == 4 and event["payload"]["when"] == "the end of epoch 1"


def test_a_loop_without_steps_or_epochs_is_judged_at_its_end(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = _start(settings, monkeypatch, {"lr": 0.5})
    model = torch.nn.Linear(2, 1)
    with run:
        for _ in range(300):  # counts for itself: the run knows no plan
            run.backward(model(torch.ones(1, 2)).sum())
            run.step()
    (event,) = _unread_events(settings, run)
    assert event["step"] == 300 and event["payload"]["when"] == "the end of the run"


@pytest.mark.parametrize("reason", ["preempted", "rule:non_finite", "pruned"])
def test_a_run_stopped_before_its_judging_point_is_not_judged(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch, reason: str) -> None:
    """The script may read a key later than the stop (tune_train.py reads one after its first
    epoch's batches; a sick trial is pruned by a rule before that): no verdict."""
    run, console = _start(settings, monkeypatch, {"lr": 0.5})
    run.context.request_stop(reason, "stopping early")
    _loop(run, 10, epochs=2)
    assert run.status == "stopped" and console.getvalue() == ""
    assert _unread_events(settings, run) == []


def test_a_trial_with_an_unread_key_stops_as_an_error_where_it_is_judged(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    run, console = _start(settings, monkeypatch, {"lr": 0.5}, trial=3)
    _loop(run, run.config["max_iters"])
    assert run.status == "stopped" and run.context.state.step == 2
    reason = run.context.stop_reason
    assert reason is not None and reason.kind.value == "error"
    assert reason.message.startswith("lr=0.5 was not read from run.config by step 2 (1% of the "
                                     "200 planned steps) (trial 3 of prudent tune): the trial "
                                     "fails rather than be scored on the script's own value.")
    (event,) = _unread_events(settings, run)
    assert event["payload"]["trial"] == 3 and event["message"] == reason.message


def test_a_resumed_run_that_was_judged_is_not_judged_again() -> None:
    watch = UnreadConfigWatch({"lr": 0.5})
    watch.load_state_dict({"judged": True})
    assert watch.judged and UnreadConfigWatch({"lr": 0.5}).state_dict() == {"judged": False}


def test_every_run_given_values_from_outside_gets_the_watch(settings: ProjectSettings) -> None:
    def watches(spec: LaunchSpec) -> list[UnreadConfigWatch]:
        return [c for c in default_components(settings, spec)
                if isinstance(c, UnreadConfigWatch)]

    assert watches(LaunchSpec(overrides={})) == []
    (plain,) = watches(LaunchSpec(overrides={"lr": 0.5}))
    assert plain.given == {"lr": 0.5} and plain.trial is None
    trial = TrialSpec("sqlite://", "s", trial_id=7, number=2, objective="val_acc")
    (tuned,) = watches(LaunchSpec(overrides={"lr": 0.5}, trial=trial))
    assert tuned.trial == 2
