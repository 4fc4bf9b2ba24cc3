"""The Profiler inside real in-process runs: summary event, profile.json, console line, trace."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import prudent
from prudent.profile import Profiler
from prudent.profile.summary import summary_line
from prudent.store.database import Store
from prudent.testing import StopAtStep, make_settings, tiny_model


class SleepyLoader:
    """Batches of ``batch`` samples that each take ``delay_s`` to arrive."""

    def __init__(self, num_batches: int, batch: int = 8, delay_s: float = 0.0) -> None:
        self.num_batches, self.batch, self.delay_s = num_batches, batch, delay_s

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.num_batches):
            time.sleep(self.delay_s)
            yield torch.zeros(self.batch, 4)


FINISHED: list[prudent.Run] = []  # the last run train() built, even when it raised


def train(home: Path, *, steps: int = 30, data_s: float = 0.0, compute_s: float = 0.0,
          eval_s: float = 0.0, fail_at: int | None = None, tokens: int | None = None,
          window: str | None = None) -> prudent.Run:
    settings = make_settings(home, profile={"interval_s": 0.02, "steps": window},
                             checkpoint={"enabled": False})  # its saves would blur the timings
    run = prudent.init(name="t", settings=settings, exit_on_stop=False)
    model = tiny_model(in_features=4)
    run.attach(model=model)
    FINISHED[:] = [run]
    with run:
        for _ in run.epochs(1):
            for x in run.batches(SleepyLoader(steps, delay_s=data_s)):
                run.backward(model(x).sum())
                time.sleep(compute_s)
                if run.state.step + 1 == fail_at:
                    raise RuntimeError("boom")
                run.step(loss=0.0, **({} if tokens is None else {"tokens": tokens}))
            time.sleep(eval_s)
            run.log(val=1.0)
    return run


def profiler_of(run: prudent.Run) -> Profiler:
    (profiler,) = [c for c in run.context.components if isinstance(c, Profiler)]
    return profiler


def events(home: Path, run: prudent.Run, kind: str) -> list[dict[str, Any]]:
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    try:
        return [e for e in store.events(run.id) if e["kind"] == kind]
    finally:
        store.close()


def test_profiling_is_on_by_default_and_first_to_see_each_step(home: Path) -> None:
    run = prudent.init(name="t", settings=make_settings(home), exit_on_stop=False)
    with run:
        pass
    assert isinstance(run.context.components[0], Profiler)
    off = prudent.init(name="t", settings=make_settings(home, profile={"enabled": False}),
                       exit_on_stop=False)
    with off:
        pass
    assert not any(isinstance(c, Profiler) for c in off.context.components)


def test_breakdown_matches_injected_delays_and_is_stored_and_in_the_run_folder(
        home: Path) -> None:
    run = train(home, steps=25, data_s=0.01, compute_s=0.005, eval_s=0.2)
    (summary,) = events(home, run, "profile")
    profile = summary["payload"]
    seconds = {name: row["s"] for name, row in profile["breakdown"].items()}
    # sleeps only ever overshoot; benchmarks/profile_accuracy.py measures how closely
    assert 0.25 <= seconds["data"] < 0.25 * 1.3
    assert seconds["compute"] >= 0.125 and 0.2 <= seconds["eval"] < 0.3
    assert profile["num_steps"] == 25 and profile["throughput"]["batch_size"] == 8
    throughput = profile["throughput"]
    recent, whole = throughput["recent"]["steps_per_s"], throughput["steps_per_s"]
    # each step sleeps >= 15 ms; "recent" is the last minute of training, "whole" the run
    assert 0 < whole < 1 / 0.015 and 0 < recent < 1 / 0.015
    assert summary["message"].startswith("profile: 25 steps in 0:00:0")
    on_disk = json.loads((run.context.run_dir / "profile.json").read_text())
    assert on_disk["breakdown"] == profile["breakdown"] and len(on_disk["timeline"]) >= 3
    findings = events(home, run, "finding")
    # eval took ~40% of the run, but one evaluation is no pattern: eval_overhead needs 3
    assert [e["name"] for e in findings] == ["input_bound"]


def test_tokens_passed_to_step_give_tokens_per_second(home: Path) -> None:
    profile = profiler_of(train(home, steps=5, tokens=512)).summary
    assert profile is not None
    throughput = profile["throughput"]
    assert throughput["tokens_per_s"] == pytest.approx(512 * throughput["steps_per_s"], rel=1e-3)


def test_a_loop_that_fetches_its_own_batches_says_data_was_not_measured(home: Path) -> None:
    # nanoGPT's get_batch: the wait for data is inside the step, where no timer sees it
    run = prudent.init(name="t", settings=make_settings(home, checkpoint={"enabled": False}),
                       exit_on_stop=False)
    with run:
        for _ in run.steps(5):
            time.sleep(0.002)  # "get_batch"
            run.step(loss=1.0)
    (summary,) = events(home, run, "profile")
    assert summary["payload"]["data_measured"] is False
    assert "data not measured" in summary["message"]
    measured = profiler_of(train(home, steps=5)).summary
    assert measured is not None and measured["data_measured"] is True
    assert "not measured" not in summary_line(measured)


def test_on_a_cpu_the_profiler_sleeps_and_times_the_kernels_stamps_in_bulk(home: Path) -> None:
    """The kernel notes each batch and step end; the profiler, called on a few steps only,
    still counts every step, sample and token, and its split adds up to the run's time."""
    from prudent.kernel.events import Event

    settings = make_settings(home, profile={"interval_s": 60}, checkpoint={"enabled": False},
                             monitor={"enabled": False})  # a loss of 0 learns nothing
    run = prudent.init(name="t", settings=settings, exit_on_stop=False)
    profiler = profiler_of(run)
    calls: list[str] = []
    run.context.wrap_handlers(lambda handler: handler if getattr(handler, "__self__", None)
                              is not profiler else _counted(handler, calls),
                              (Event.BATCH_LOADED, Event.STEP_END))
    started = time.perf_counter()
    with run:
        for _ in run.epochs(2):
            for _x in run.batches(SleepyLoader(1500, batch=6)):
                run.step(loss=0.0, tokens=10)
    took = time.perf_counter() - started
    assert run.state.step == 3000 and "on_batch_loaded" not in calls
    assert 3 <= calls.count("on_step_end") <= 30  # the first step, then every <= 1024 steps
    summary = profiler.summary
    assert summary is not None and summary["num_steps"] == 3000
    assert summary["throughput"]["batch_size"] == 6
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(
        10 * summary["throughput"]["steps_per_s"], rel=1e-3)
    assert 0.5 * took < sum(row["s"] for row in summary["breakdown"].values()) <= took


def _counted(handler: Any, calls: list[str]) -> Any:
    def counted(*args: Any) -> None:
        calls.append(handler.__name__)
        handler(*args)
    return counted


def test_a_failed_run_still_gets_its_profile(home: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        train(home, steps=10, fail_at=6)
    (run,) = FINISHED
    assert run.status == "failed"
    assert profiler_of(run).summary["num_steps"] == 5  # type: ignore[index]
    assert (run.context.run_dir / "profile.json").exists()


def test_console_line_goes_to_stderr_and_is_silent_when_the_console_is_off(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = prudent.init(name="t", settings=make_settings(home, console={"mode": "plain"}),
                       exit_on_stop=False)
    with run:
        run.step(loss=1.0)
    err = capsys.readouterr().err
    # 0:00:01 when the run's first save imports torch.distributed.checkpoint (this test alone)
    assert re.search(rf"prudent \| {run.id} \| profile: 1 step in 0:00:0\d \(", err), err
    assert "no bottleneck found" in err
    train(home, steps=3)
    assert "profile:" not in capsys.readouterr().err


def test_profile_steps_window_writes_a_trace_and_an_operator_table(home: Path) -> None:
    run = train(home, steps=12, window="4:7")
    profile = profiler_of(run).summary
    assert profile is not None and profile["trace"]["steps"] == "4:7"
    trace = json.loads(Path(profile["trace"]["trace"]).read_text())
    steps = {e["name"] for e in trace["traceEvents"] if str(e.get("name")).startswith("Profiler")}
    assert steps == {"ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"}  # the run's numbers
    assert Path(profile["trace"]["ops_table"]).name == "ops-steps-4-7.txt"
    assert profile["trace"]["top_ops"][0]["calls"] >= 1
    (event,) = [e for e in events(home, run, "profile") if e["name"] == "trace"]
    assert "ui.perfetto.dev" in event["message"]


def test_writing_the_trace_is_the_profilers_stall_not_the_next_steps(home: Path) -> None:
    # the trace is written at the window's last step (tens of ms to seconds): charged to the
    # next step, it made that step an outlier and a step_outliers finding against the user
    profiler = profiler_of(train(home, steps=60, window="10:15"))
    profile = profiler.summary
    assert profile is not None and profile["trace"]["steps"] == "10:15"
    written = profile["profiler_s"]
    assert written > 0
    # the step after the window may still be slow by a millisecond or two (a busy machine,
    # the profiler's teardown), never by the seconds the trace took to write
    after = [o.duration_s for o in profiler.timer.outliers if o.step == 16]
    assert all(duration < written / 2 for duration in after), (after, written)


def test_window_past_the_end_is_reported_at_the_first_step_and_training_goes_on(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(home, console={"mode": "plain"}, profile={"steps": "50:60"})
    run = prudent.init(name="t", settings=settings, exit_on_stop=False)
    with run:
        for _ in run.epochs(2):
            for _x in run.batches(SleepyLoader(10)):
                run.step()
    assert run.status == "completed" and run.state.step == 20
    err = capsys.readouterr().err
    assert ("--profile-steps 50:60 was not traced: training ends at step 20 at the latest "
            "(2 epochs x 10 batches). Choose a window inside the run") in err
    assert not list(run.context.run_dir.glob("trace-*"))


def test_window_past_the_end_of_an_iteration_loop_is_reported(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(home, console={"mode": "plain"}, profile={"steps": "50:60"})
    run = prudent.init(name="t", settings=settings, exit_on_stop=False)
    with run:
        for _ in run.steps(30):  # nanoGPT's shape: no epochs, no loader
            run.step()
    assert run.status == "completed" and run.state.step == 30
    assert ("--profile-steps 50:60 was not traced: training ends at step 30 at the latest "
            "(run.steps(30))") in capsys.readouterr().err


def test_window_the_run_stops_inside_keeps_what_was_traced(home: Path) -> None:
    run = train(home, steps=6, window="3:100")
    profile = profiler_of(run).summary
    assert profile is not None and profile["trace"]["steps"] == "3:6"


def test_console_line_can_go_to_any_stream() -> None:
    stream = io.StringIO()
    profiler = Profiler(stream=stream)

    class FakeRun:
        id = "r1"
        refused = False

    profiler._say(FakeRun(), "hello")  # type: ignore[arg-type]
    assert stream.getvalue() == "prudent | r1 | hello\n"


def test_the_loop_time_an_asynchronous_save_takes_is_charged_to_checkpoint(home: Path) -> None:
    settings = make_settings(home, profile={"interval_s": 0.05},
                             checkpoint={"every": "1steps", "keep": 1})
    run = prudent.init(name="t", settings=settings, exit_on_stop=False)
    big = torch.nn.Linear(2048, 2048)  # 16 MB to snapshot at every step
    run.attach(model=big)
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(SleepyLoader(10)):
                run.step(loss=0.0)
    summary = profiler_of(run).summary
    assert summary is not None and summary["counts"]["checkpoints"] >= 10  # + the epoch end
    seconds = {name: row["s"] for name, row in summary["breakdown"].items()}
    # the snapshot copies 16 MB while the loop waits; before, it was lost in "other"
    assert seconds["checkpoint"] > seconds["other"] and seconds["checkpoint"] > 0.005


def test_a_resumed_runs_samples_are_recorded_at_the_runs_steps(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # recorded at this process's count of steps (and at 0 before its first), a relaunch's
    # samples sat under the previous attempt's curve, and TensorBoard, purging from the first
    # step the relaunch wrote, dropped that whole attempt
    monkeypatch.setenv("PRUDENT_RUN_ID", "resumed")

    def attempt(stop_at: int | None = None, setup_s: float = 0.0) -> None:
        settings = make_settings(home, profile={"interval_s": 0.02})
        run = prudent.init(name="t", settings=settings, exit_on_stop=False)
        if stop_at is not None:
            run.context.add_component(StopAtStep(stop_at))
        time.sleep(setup_s)  # the script loads its data: samples before the resume is known
        model = tiny_model(in_features=4)
        run.attach(model=model)
        with run:
            for _ in run.steps(30):
                run.backward(model(torch.zeros(8, 4)).sum())
                time.sleep(0.005)
                run.step(loss=0.0)

    attempt(stop_at=10)
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    try:
        first = len(store.metric_series("resumed", "profile/cpu_pct"))
        attempt(setup_s=0.15)
        steps = [step for step, _ in store.metric_series("resumed", "profile/cpu_pct")]
    finally:
        store.close()
    before, after = steps[:first], steps[first:]
    assert before and max(before) <= 11, before  # at the step in progress: the stop's is 11
    assert len(after) >= 8 and min(after) == 11 and max(after) == 30, after
    assert after == sorted(after), after  # one curve, in the order it was taken


def test_samples_go_to_the_store_with_the_time_split_and_stay_out_of_the_latest_values(
        home: Path) -> None:
    # a run on a machine that then dies: its timeline must be in the store, not only in its
    # folder's profile.json (the report and dashboard read it from there on any machine)
    run = train(home, steps=25, data_s=0.01, compute_s=0.005)
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    try:
        names = set(store.last_metrics(run.id))
        split = {c: [v for _, v in store.metric_series(run.id, f"profile/{c}_pct")]
                 for c in ("data", "compute", "checkpoint", "eval", "other")}
    finally:
        store.close()
    assert {"profile/cpu_pct", "profile/rss_mb", "profile/steps_per_s"} <= names
    assert len(split["data"]) >= 3 and len({len(v) for v in split.values()}) == 1
    # time is charged at the step's events, so a 20 ms interval holds one or two 15 ms steps
    # (and the last one, taken at the end, a few ms): each interval's split is the shares of
    # the time charged in it, adding up to 100% (an interval that charged nothing: 0)
    totals = [sum(values) for values in zip(*split.values())]
    assert all(abs(t - 100) < 1e-6 or t == 0 for t in totals), totals
    assert sum(1 for t in totals if t) >= len(totals) - 2, totals
    # the loader sleeps twice as long as the step computes
    assert sum(split["data"]) > 1.15 * sum(split["compute"]), split
    assert not [k for k in run.latest if k.startswith("profile/")]  # the model's, not the machine's
