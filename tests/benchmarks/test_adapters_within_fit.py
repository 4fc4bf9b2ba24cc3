"""The within-fit adapter benchmark's switch: in an off-block Lightning never calls prudent's
per-step hooks (the run does not see those steps), and each arm's steps are timed apart."""

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


def test_the_off_blocks_steps_never_reach_prudent_and_each_arm_is_timed_apart(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prudent.lightning import PrudentCallback

    seen: list[int] = []
    built: list[PrudentCallback] = []
    original = within.BlockSwitch.__init__

    def keep(self: within.BlockSwitch, callback: PrudentCallback, *args: object,
             **kwargs: object) -> None:
        built.append(callback)
        original(self, callback, *args, **kwargs)
        step_ended = self.step_ended

        def counted() -> None:
            seen.append(callback.adapter.ctx.state.step)
            step_ended()

        self.step_ended = counted  # type: ignore[method-assign]

    monkeypatch.setattr(within.BlockSwitch, "__init__", keep)
    # what Lightning's seed_everything (and the OpenMP runtime it loads) put into os.environ
    for name, value in (("PL_GLOBAL_SEED", "0"), ("PL_SEED_WORKERS", "0"),
                        ("KMP_DUPLICATE_LIB_OK", "True"), ("KMP_INIT_AT_FORK", "FALSE")):
        monkeypatch.setenv(name, value)
    started = time.perf_counter()
    times = within.one_fit(steps=30, block=10, hidden=16, pause=[], clock=time.perf_counter,
                           start_on=True)
    took = time.perf_counter() - started
    # 60 steps in blocks of 10, on first: the run counted steps 1-10, 21-30 and 41-50 only
    assert seen[:12] == [*range(1, 11), 10, 10] and seen[-1] == 30
    run = built[0].run
    assert run.context.state.step == 30 and run.context.closed
    # every step timed once, in its own arm, less each block's first and the fit's first
    assert len(times[True]) == len(times[False]) == 27
    assert all(0 < t < took for t in times[True] + times[False])
    for name in within.PER_STEP_HOOKS:  # the callback left as Lightning found it
        assert callable(getattr(built[0], name))


def test_a_mistyped_component_to_pause_is_refused_with_the_names_there_are(home: Path) -> None:
    with pytest.raises(SystemExit, match=r"--pause monitr: no such component .* monitor, .*"):
        within.one_fit(steps=10, block=5, hidden=16, pause=["monitr"], clock=time.perf_counter,
                       start_on=True)
