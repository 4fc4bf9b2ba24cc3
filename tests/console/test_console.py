from __future__ import annotations

import io
import shlex
import sys

import prudent
from prudent.console import ConsoleReporter, ConsoleSettings
from prudent.store.recorder import MetricsRecorder
from prudent.wiring.config import ProjectSettings


class NotATerminal(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_plain_mode_prints_progress_logs_and_a_summary(settings: ProjectSettings) -> None:
    out = NotATerminal()
    reporter = ConsoleReporter(ConsoleSettings(mode="auto", interval_s=1e-6), stream=out)
    assert reporter.mode == "plain"
    run = prudent.init(name="console", settings=settings, exit_on_stop=False,
                       components=[reporter])
    with run:
        for _ in run.epochs(2):
            for _ in run.batches(range(5)):
                run.step(loss=0.5)
            run.log(val_acc=0.9)
    lines = out.getvalue().splitlines()
    assert any("epoch 2/2" in line and "steps/s" in line for line in lines)
    assert f"prudent | {run.id} | epoch 1 step 5: val_acc=0.9" in lines
    assert lines[-1].startswith(f"prudent | {run.id} | completed after 0:00:0")
    assert "10 steps" in lines[-1]
    assert not any("$" in line for line in lines)  # no instance known: no cost shown


def test_an_iteration_loop_logs_without_an_epoch(settings: ProjectSettings) -> None:
    out = NotATerminal()
    reporter = ConsoleReporter(ConsoleSettings(mode="plain"), stream=out)
    run = prudent.init(name="console", settings=settings, exit_on_stop=False,
                       components=[MetricsRecorder(), reporter])
    with run:
        for it in range(6):
            if it % 3 == 0:
                run.log(val_loss=2.5)
            run.step(loss=0.5, tokens=256)
    lines = out.getvalue().splitlines()
    assert f"prudent | {run.id} | step 3: val_loss=2.5" in lines
    assert not any("epoch" in line for line in lines)
    # the token count is for tokens/s, not a last value: the summary ends with the metrics
    assert lines[-1].endswith("6 steps. loss=0.5 val_loss=2.5"), lines[-1]


def test_plain_line_shows_the_live_cost_the_meter_publishes(settings: ProjectSettings) -> None:
    out = NotATerminal()
    reporter = ConsoleReporter(ConsoleSettings(mode="plain", interval_s=1e-6), stream=out)
    run = prudent.init(name="console", settings=settings, exit_on_stop=False,
                       components=[reporter])
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(range(3)):
                run.context.gauges["cost_usd"] = 1.234
                run.step(loss=0.5)
    assert any(" | $1.23" in line for line in out.getvalue().splitlines())


def test_rich_mode_draws_a_bar_and_stops_it(settings: ProjectSettings) -> None:
    out = io.StringIO()
    reporter = ConsoleReporter(ConsoleSettings(mode="rich"), stream=out)
    run = prudent.init(name="bar", settings=settings, exit_on_stop=False, components=[reporter])
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(range(3)):
                run.step(loss=0.5)
    assert reporter._progress is None and "completed after" in out.getvalue()


def test_the_status_line_of_an_iteration_loop_counts_steps_of_run_steps(
        settings: ProjectSettings) -> None:
    out = NotATerminal()
    reporter = ConsoleReporter(ConsoleSettings(mode="plain", interval_s=1e-6), stream=out)
    run = prudent.init(name="console", settings=settings, exit_on_stop=False,
                       components=[reporter])
    with run:
        for _ in run.steps(50):
            run.step(loss=0.5)
    status = [line for line in out.getvalue().splitlines() if "steps/s" in line]
    assert status and all("epoch" not in line for line in status)
    assert any(" | step 50/50 | " in line and " | eta " in line for line in status)


def test_the_status_line_of_a_loop_of_its_own_counts_bare_steps(settings: ProjectSettings) -> None:
    out = NotATerminal()
    reporter = ConsoleReporter(ConsoleSettings(mode="plain", interval_s=1e-6), stream=out)
    run = prudent.init(name="console", settings=settings, exit_on_stop=False,
                       components=[reporter])
    with run:
        for _ in range(5):
            run.step(loss=0.5)
    status = [line for line in out.getvalue().splitlines() if "steps/s" in line]
    assert status and all("epoch" not in line and " | eta " not in line for line in status)
    assert f"prudent | {run.id} | step 5 | " in status[-1]


def test_a_preempted_run_whose_id_was_made_says_how_to_resume_it(
        settings: ProjectSettings, monkeypatch) -> None:
    """The same command again would start a new run from step 0: the stop line names the id."""
    import os
    import signal

    from prudent.launch.spec import ENV_RUN_ID

    said = {}
    for given in (None, "mine"):
        if given:
            monkeypatch.setenv(ENV_RUN_ID, given)
        out = NotATerminal()
        run = prudent.init(name="console", settings=settings, exit_on_stop=False,
                           components=[ConsoleReporter(ConsoleSettings(mode="plain"), stream=out)])
        with run:
            for step in run.steps(50):
                if step == 3:
                    os.kill(os.getpid(), signal.SIGTERM)
                run.step(loss=0.5)
        said[given] = (run.id, out.getvalue().splitlines()[-1])
    made_id, last = said[None]
    # the whole command, as typed (`python train.py ...` read as if it took --run-id itself
    # started a new run)
    assert last == (f"prudent | {made_id} | to resume it from its newest checkpoint, run: "
                    f"prudent run --run-id {made_id} -- {shlex.join(sys.orig_argv)}")
    assert "to resume it" not in said["mine"][1]  # the id was given: the same command resumes
