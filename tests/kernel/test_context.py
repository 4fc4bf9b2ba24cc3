"""The RunContext's event lists: what a component and an instrument may change, and how."""

from __future__ import annotations

from typing import Any

import prudent
from prudent.kernel.events import Component, Event
from prudent.wiring.config import ProjectSettings


class Counter(Component):
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def on_step_end(self, ctx: Any, metrics: Any) -> None:
        self.calls += 1


class EveryOtherStep(Counter):
    """Needs ``after_backward`` on even steps only: it says so instead of returning at once."""

    def __init__(self) -> None:
        super().__init__("every_other")
        self.backward_steps: list[int] = []

    def on_after_backward(self, ctx: Any, loss: Any) -> None:
        self.backward_steps.append(ctx.state.step + 1)

    def on_step_end(self, ctx: Any, metrics: Any) -> None:
        super().on_step_end(ctx, metrics)
        ctx.subscribe(self, Event.AFTER_BACKWARD, (ctx.state.step + 1) % 2 == 0)


def _train(run: prudent.Run, steps: int) -> None:
    import torch

    weight = torch.ones(1, requires_grad=True)
    for _ in range(steps):
        run.backward((weight * 2).sum())
        run.step()


def test_a_component_that_unsubscribes_is_not_called_until_it_subscribes_again(
        settings: ProjectSettings) -> None:
    sparse = EveryOtherStep()
    run = prudent.init(name="subscribe", settings=settings, exit_on_stop=False,
                       components=[sparse])
    _train(run, 6)
    run.context.finish("completed")
    assert sparse.backward_steps == [1, 2, 4, 6] and sparse.calls == 6


def test_pausing_keeps_order_and_what_a_component_muted_itself(settings: ProjectSettings) -> None:
    first, sparse, last = Counter("first"), EveryOtherStep(), Counter("last")
    run = prudent.init(name="pause", settings=settings, exit_on_stop=False,
                       components=[first, sparse, last])
    ctx = run.context
    ctx.subscribe(sparse, Event.AFTER_BACKWARD, False)
    ctx.pause([first, sparse])
    assert ctx.handlers[Event.STEP_END] == [last.on_step_end]
    ctx.pause([first, sparse], paused=False)
    assert ctx.handlers[Event.STEP_END] == [first.on_step_end, sparse.on_step_end,
                                            last.on_step_end]
    assert ctx.handlers[Event.AFTER_BACKWARD] == []  # still muted by the component itself
    assert not ctx.is_subscribed(sparse, Event.AFTER_BACKWARD)
    ctx.finish("completed")


def test_wrapped_handlers_survive_a_component_resubscribing(settings: ProjectSettings) -> None:
    sparse = EveryOtherStep()
    run = prudent.init(name="wrap", settings=settings, exit_on_stop=False, components=[sparse])
    seen: list[str] = []

    def wrap(handler: Any) -> Any:
        def call(*args: Any) -> None:
            seen.append(handler.__name__)
            handler(*args)
        return call

    run.context.wrap_handlers(wrap, [Event.AFTER_BACKWARD, Event.STEP_END])
    _train(run, 3)
    run.context.finish("completed")
    assert seen.count("on_after_backward") == 2 and seen.count("on_step_end") == 3


def test_a_store_that_stays_away_at_the_end_does_not_fail_a_run_that_trained(
        settings: ProjectSettings, monkeypatch: Any, capsys: Any) -> None:
    from prudent.kernel.errors import StoreError

    run = prudent.init(name="outage", settings=settings, exit_on_stop=False, components=[])
    store = run.context.store
    assert store is not None

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise StoreError("cannot reach the run store postgresql://u:***@db/runs")

    monkeypatch.setattr(store, "update_run", unreachable)
    with run:
        run.step()
    assert run.status == "completed" and run.exit_code == 0
    assert "ended completed but its record could not be closed" in capsys.readouterr().err


class Sleeper(Component):
    """Looks at STEP_END every ``every`` steps only, as the checkpointer's schedule does."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.steps: list[int] = []

    def on_step_end(self, ctx: Any, metrics: Any) -> None:
        self.steps.append(ctx.state.step)
        ctx.sleep_until(self, ctx.state.step + self.every)


def test_a_component_asleep_is_called_again_at_its_step_and_its_neighbours_every_step(
        settings: ProjectSettings) -> None:
    sleeper, after = Sleeper(every=5), Counter("after")  # after: behind it in the same list
    run = prudent.init(name="sleep", settings=settings, exit_on_stop=False,
                       components=[sleeper, after])
    _train(run, 21)
    run.context.finish("completed")
    assert sleeper.steps == [1, 6, 11, 16, 21]
    assert after.calls == 21  # a handler that sleeps itself mid-loop skips nobody else


def test_sleeping_one_step_ahead_changes_nothing(settings: ProjectSettings) -> None:
    sleeper = Sleeper(every=1)
    run = prudent.init(name="sleep1", settings=settings, exit_on_stop=False, components=[sleeper])
    _train(run, 4)
    run.context.finish("completed")
    assert sleeper.steps == [1, 2, 3, 4]


class LossWatcher(Component):
    name = "watcher"

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def on_start(self, ctx: Any) -> None:
        ctx.watch_loss(self, self.watched, above=5.0)

    def watched(self, ctx: Any, loss: Any, value: Any) -> None:
        self.seen.append((ctx.state.step + 1, value))


def test_the_loss_watch_calls_only_for_losses_above_its_threshold_or_nan(
        settings: ProjectSettings) -> None:
    import math

    import torch

    watcher = LossWatcher()
    run = prudent.init(name="watch", settings=settings, exit_on_stop=False, components=[watcher])
    weight = torch.ones(1, requires_grad=True)
    for value in (1.0, 5.0, 7.0, 2.0, math.nan, 3.0):
        run.backward((weight * value).sum())
        run.step()
    assert [step for step, _ in watcher.seen] == [3, 5]  # 7.0 and NaN; 5.0 is not above 5
    assert watcher.seen[0][1] == 7.0 and math.isnan(watcher.seen[1][1])
    run.context.pause([watcher])
    run.backward((weight * 9.0).sum())  # a paused component's watch is paused with it
    run.step()
    run.context.finish("completed")
    assert len(watcher.seen) == 2 and run.context.loss_watched_step == 6


class BackwardSleeper(Component):
    """Needs ``after_backward`` every ``every`` steps only, and sleeps through the others."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.backward_steps: list[int] = []

        self.sooner: dict[int, int] = {}  # at the end of step k: after_backward due at step v

    def on_after_backward(self, ctx: Any, loss: Any) -> None:
        step = ctx.state.step + 1
        self.backward_steps.append(step)
        ctx.sleep_until(self, step + self.every, Event.AFTER_BACKWARD)

    def on_step_end(self, ctx: Any, metrics: Any) -> None:
        if ctx.state.step in self.sooner:  # the same step's request, replaced
            ctx.sleep_until(self, self.sooner[ctx.state.step], Event.AFTER_BACKWARD)


def test_after_backward_sleeps_until_its_step_and_a_wake_calls_it_sooner(
        settings: ProjectSettings) -> None:
    sleeper = BackwardSleeper(every=4)
    run = prudent.init(name="sleep-backward", settings=settings, exit_on_stop=False,
                       components=[sleeper])
    _train(run, 10)
    assert sleeper.backward_steps == [1, 5, 9]
    run.context.wake(sleeper, Event.AFTER_BACKWARD)  # step 11 is looked at after all
    _train(run, 1)
    sleeper.sooner = {12: 13, 13: 16}  # the next step: awake after all; then step 16
    _train(run, 6)
    run.context.finish("completed")
    assert sleeper.backward_steps == [1, 5, 9, 11, 13, 16]


class ValueReader(Component):
    name = "reader"

    def __init__(self) -> None:
        self.kept: Any = None

    def on_start(self, ctx: Any) -> None:
        self.kept = ctx.keep_step_values(self, "loss")


def test_the_kernel_keeps_one_metric_of_every_step_for_a_reader_in_bulk(
        settings: ProjectSettings) -> None:
    import torch

    reader = ValueReader()
    run = prudent.init(name="values", settings=settings, exit_on_stop=False, components=[reader])
    weight = torch.ones(3, requires_grad=True)
    run.step(loss=torch.tensor(2.5))  # a CPU tensor: its number
    run.step(loss=1.5)
    run.step()  # no loss this step
    run.step(loss=weight * 2)  # several numbers: kept as a tensor, but not its graph
    steps, values = reader.kept.take()
    assert steps == [1, 2, 3, 4]
    assert values[:3] == [2.5, 1.5, None] and values[0].__class__ is float
    assert values[3].tolist() == [2.0, 2.0, 2.0] and not values[3].requires_grad
    assert reader.kept.take() == ([], [])  # taken: kept anew
    run.context.pause([reader])
    run.step(loss=9.0)  # nothing is noted for a paused reader
    run.context.pause([reader], paused=False)
    run.step(loss=3.0)
    run.context.finish("completed")
    assert reader.kept.take() == ([6], [3.0])
