"""The within-fit benchmark's switch: in an off-block neither Lightning nor the hand-written
loop calls prudent (the run does not see those steps), and each arm's steps are timed apart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("lightning")
within = pytest.importorskip("benchmarks.adapters_within_fit")
pytestmark = [
    pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.`:FutureWarning"),
    # the benchmark trains examples/lightning_digits.py's module without its validation data
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no"),
]


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[object]]:
    """The run's step count at each step's end, and the contexts the switches were built on."""
    seen: list[int] = []
    built: list[object] = []
    original = within.BlockSwitch.__init__

    def keep(self: within.BlockSwitch, context: object, *args: object, **kwargs: object) -> None:
        built.append(context)
        original(self, context, *args, **kwargs)
        step_ended = self.step_ended

        def counted() -> None:
            seen.append(context.state.step)  # type: ignore[attr-defined]
            step_ended()

        self.step_ended = counted  # type: ignore[method-assign]

    monkeypatch.setattr(within.BlockSwitch, "__init__", keep)
    return seen, built


def _assert_switched(switch: within.BlockSwitch, seen: list[int], context: object,
                     took: float) -> None:
    # 60 steps in blocks of 10, on first: the run counted steps 1-10, 21-30 and 41-50 only
    assert seen[:12] == [*range(1, 11), 10, 10] and seen[-1] == 30
    assert context.state.step == 30 and context.closed  # type: ignore[attr-defined]
    # every step timed once, in its own arm, less each block's first and the fit's first
    on = [s for s in switch.steps if s[1]]
    off = [s for s in switch.steps if not s[1]]
    assert len(on) == len(off) == 27
    assert all(0 < wall < took and 0 <= cpu < took for _, _, wall, cpu in switch.steps)
    figures = within.fit_figures(switch)
    assert figures["pairs"] == 3 and figures["off_ms"] > 0
    assert {"typical_us_cpu", "mean_us_cpu", "typical_us_wall", "mean_us_wall"} <= set(figures)


def test_the_off_blocks_steps_never_reach_prudent_and_each_arm_is_timed_apart(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prudent.lightning import PrudentCallback

    seen, built = _counting(monkeypatch)
    callbacks: list[PrudentCallback] = []
    monkeypatch.setattr(PrudentCallback, "__init__", _kept(PrudentCallback.__init__, callbacks))
    # what Lightning's seed_everything (and the OpenMP runtime it loads) put into os.environ
    for name, value in (("PL_GLOBAL_SEED", "0"), ("PL_SEED_WORKERS", "0"),
                        ("KMP_DUPLICATE_LIB_OK", "True"), ("KMP_INIT_AT_FORK", "FALSE")):
        monkeypatch.setenv(name, value)
    started = time.perf_counter()
    switch = within.lightning_fit(steps=30, block=10, hidden=16, pause=[], start_on=True)
    _assert_switched(switch, seen, built[0], time.perf_counter() - started)
    for name in within.PER_STEP_HOOKS:  # the callback left as Lightning found it
        assert callable(getattr(callbacks[0], name))


def test_the_hand_written_loops_off_steps_never_reach_prudent(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen, built = _counting(monkeypatch)
    started = time.perf_counter()
    switch = within.loop_fit(steps=30, block=10, hidden=16, pause=[], start_on=True)
    _assert_switched(switch, seen, built[0], time.perf_counter() - started)


def _kept(init: object, into: list[object]) -> object:
    def keep(self: object, *args: object, **kwargs: object) -> None:
        into.append(self)
        init(self, *args, **kwargs)  # type: ignore[operator]

    return keep


@pytest.mark.parametrize("loop", ["lightning", "loop"])
def test_a_mistyped_component_to_pause_is_refused_with_the_names_there_are(
        home: Path, loop: str) -> None:
    with pytest.raises(SystemExit, match=r"--pause monitr: no such component .* monitor, .*"):
        within.FITS[loop](steps=10, block=5, hidden=16, pause=["monitr"], start_on=True)
