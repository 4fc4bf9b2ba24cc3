"""`prudent profile`, the profile in `prudent show --json`, and --profile-steps bad input."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import prudent
from prudent.cli import main
from prudent.profile.summary import NOT_MEASURED
from prudent.testing import make_settings


def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["prudent", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def slow_batches(num_batches: int, delay_s: float) -> Iterator[torch.Tensor]:
    for _ in range(num_batches):
        time.sleep(delay_s)
        yield torch.zeros(16, 2)


@pytest.fixture
def slow_data_run(home: Path) -> str:
    """A finished run that spends most of each step waiting for its data."""
    settings = make_settings(home, checkpoint={"enabled": False})
    run = prudent.init(name="slow-data", settings=settings, exit_on_stop=False)
    with run:
        for _ in run.epochs(1):
            for _x in run.batches(slow_batches(25, delay_s=0.02)):
                run.step(loss=1.0)
            run.log(acc=0.5)
    return run.id


def test_prudent_profile_prints_the_breakdown_and_json(home: Path, slow_data_run: str,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(monkeypatch, capsys, "profile", "latest")
    assert code == 0
    assert "where the time went" in out and "profile: 25 steps" in out
    assert "input_bound: waiting for data took" in out
    code, out, _ = cli(monkeypatch, capsys, "profile", slow_data_run, "--json")
    document = json.loads(out)
    assert document["id"] == slow_data_run and document["profile"]["num_steps"] == 25
    assert document["profile"]["throughput"]["batch_size"] == 16
    assert [f["id"] for f in document["findings"]] == ["input_bound"]
    assert document["findings"][0]["evidence"]["data_pct"] > 50


def test_prudent_profile_of_an_iteration_loop_speaks_in_steps(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """nanoGPT's loop: no run.epochs, no run.batches (so no samples/s), a log every 10 steps."""
    settings = make_settings(home, checkpoint={"enabled": False}, profile={"interval_s": 0.02})
    run = prudent.init(name="iterations", settings=settings, exit_on_stop=False)
    with run:
        for it in range(40):  # a loss that falls: a flat one is rightly stopped by the rules
            if it % 10 == 0:
                run.log(val_loss=1.0 / (it + 1))
            time.sleep(0.01)
            run.step(loss=1.0 / (it + 1))
    code, out, _ = cli(monkeypatch, capsys, "profile", run.id)
    assert code == 0, out
    assert "profile: 40 steps" in out and "steps/s" in out
    assert "recent throughput: " in out and "samples/s" not in out
    assert NOT_MEASURED in out  # its get_batch() is inside the step: said, not hidden
    out = out.replace(NOT_MEASURED, "")
    assert "epoch" not in out and "batch" not in out


def test_show_json_has_profile_and_findings(home: Path, slow_data_run: str,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(monkeypatch, capsys, "show", slow_data_run, "--json")
    detail = json.loads(out)
    assert code == 0 and detail["profile"]["breakdown"]["data"]["pct"] > 50
    assert [f["id"] for f in detail["findings"]] == ["input_bound"]
    assert detail["findings"][0]["message"] == detail["profile"]["findings"][0]["message"]


def test_run_without_a_profile_says_why(home: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = prudent.init(name="off", settings=make_settings(home, profile={"enabled": False}),
                       exit_on_stop=False)
    with run:
        run.step()
    code, _, err = cli(monkeypatch, capsys, "profile", run.id)
    assert code == 2
    assert err.strip() == (f"prudent: error: run {run.id} has no profile (completed): a profile "
                           "is written when a run ends; profiling was off, or the process was "
                           "killed first")


@pytest.mark.parametrize(("window", "what"), [("7:7", "empty"), ("ten:20", "invalid"),
                                              ("20:10", "inverted")])
def test_bad_profile_steps_exit_2_and_write_nothing(home: Path, window: str, what: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(monkeypatch, capsys, "run", "--profile-steps", window, "--",
                       sys.executable, "-c", "raise SystemExit(9)")
    assert code == 2 and err.startswith(f"prudent: error: --profile-steps '{window}' is {what}")
    assert not home.exists()


def test_a_resumed_run_says_which_attempt_the_split_covers(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from prudent.report.pages import run_page
    from prudent.report.reader import ReadOnlyStore
    from prudent.testing import StopAtStep

    monkeypatch.setenv("PRUDENT_RUN_ID", "twice")  # the second start resumes the first
    settings = make_settings(home, checkpoint={"every": "5steps"}, monitor={"enabled": False})
    for stop_at in (12, None):
        run = prudent.init(name="twice", settings=settings, exit_on_stop=False)
        run.attach(model=torch.nn.Linear(2, 2))
        if stop_at:
            run.context.add_component(StopAtStep(stop_at))
        with run:
            for _ in run.steps(30):
                run.step(loss=1.0)
    code, out, _ = cli(monkeypatch, capsys, "profile", "twice", "--json")
    rows = json.loads(out)["attempts"]
    assert code == 0 and [r["attempt"] for r in rows] == [1, 2]
    assert rows[0]["first_step"] == 0 and rows[1]["last_step"] == 30
    assert rows[0]["last_step"] == rows[1]["first_step"] == 12  # saved as it stopped
    code, out, _ = cli(monkeypatch, capsys, "profile", "twice")
    assert f"the split covers attempt 2 of 2 (steps {rows[1]['first_step']}-30)" in out
    store = ReadOnlyStore(f"sqlite:///{home / 'prudent.db'}")
    page = run_page(store, "twice")
    store.close()
    assert [a["attempt"] for a in page["profile_attempts"]] == [1, 2]
