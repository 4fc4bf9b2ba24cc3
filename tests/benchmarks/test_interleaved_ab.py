"""The interleaved A/B benchmark's switch: the arms differ by the switched components only."""

from __future__ import annotations

from pathlib import Path

import pytest

import prudent
from prudent.kernel.events import Event
from prudent.monitor import Monitor

ab = pytest.importorskip("benchmarks.interleaved_ab")


def test_switching_off_removes_the_monitors_handlers_and_hooks_and_on_restores_them(
        tmp_path: Path) -> None:
    with ab.prudent_environment(str(tmp_path / "home")):
        model, opt, _ = ab.training_parts(ab.make_data(2))()
        run = prudent.init(name="switch", exit_on_stop=False)
        monitor = next(c for c in run.context.components if isinstance(c, Monitor))
        run.attach(model=model, optimizer=opt)
        switch = ab._Switch(run, "monitor")
        full = list(run.context.handlers[Event.STEP_END])
        monitor.stats.activations.arm(1)  # a sample about to be taken
        switch.set(False)
        assert monitor.on_step_end not in run.context.handlers[Event.STEP_END]  # the run's own (aliased) list
        assert monitor.on_after_backward not in run.context.handlers[Event.AFTER_BACKWARD]
        assert len(run.context.handlers[Event.STEP_END]) == len(full) - 1
        assert not monitor.stats.activations.armed  # no hooks left to slow the off arm
        assert monitor not in run.context.loss_watchers  # the kernel's loss watch: off too
        switch.set(True)
        assert run.context.handlers[Event.STEP_END] == full  # back, in the same order
        assert monitor in run.context.loss_watchers
        run.context.finish("completed")


def test_switching_all_off_leaves_only_the_kernel(tmp_path: Path) -> None:
    with ab.prudent_environment(str(tmp_path / "home")):
        run = prudent.init(name="switch-all", exit_on_stop=False)
        switch = ab._Switch(run, "all")
        switch.set(False)
        assert all(not run.context.handlers[event] for event in ab.PER_STEP_EVENTS)
        switch.set(True)
        assert {type(h.__self__).__name__ for h in run.context.handlers[Event.STEP_END]} >= {"Monitor", "Checkpointer"}
        run.context.finish("completed")


@pytest.mark.parametrize("which", ["monitor", "all"])
def test_one_run_alternates_blocks_and_pairs_neighbours(tmp_path: Path, which: str) -> None:
    with ab.prudent_environment(str(tmp_path / "home")):
        on, off, pairs = ab.one_run(ab.training_parts(ab.make_data(80)), 20, True, which)
    assert len(on) == len(off) == 40 and len(pairs) == 2
    # (mean, median) step of the on block and of its neighbour
    assert all(min(a) > 0 and min(b) > 0 and len(a) == len(b) == 2 for a, b in pairs)
