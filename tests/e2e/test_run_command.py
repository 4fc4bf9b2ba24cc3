"""`prudent run` end to end: real scripts in real subprocesses, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from prudent.store.database import Store
from tests.e2e.conftest import Project, script


def test_design_api_script_runs_unchanged_without_prudent_run(project: Project) -> None:
    result = project.python(script("design_api.py"))
    assert result.returncode == 0, result.stderr
    shown = project.show("latest")
    assert shown["status"] == "completed" and shown["stop_reason"] is None
    assert shown["config"] == {"lr": 0.001, "epochs": 5}
    assert shown["step"] == 60 and 0.5 < shown["metrics"]["val_acc"] <= 1.0
    assert f"run={shown['id']}" in result.stdout


def test_design_api_script_under_prudent_run_gets_set_overrides(project: Project) -> None:
    result = project.prudent("run", "--run-id", "r1", "--set", "lr=1e-2", "--set", "epochs=2",
                             "--", sys.executable, script("design_api.py"))
    assert result.returncode == 0, result.stderr
    assert "done lr=0.01 epochs=2 run=r1" in result.stdout
    assert "prudent | r1 | completed after" in result.stderr
    shown = project.show("r1")
    assert (shown["status"], shown["config"], shown["step"]) == ("completed", {"lr": 0.01, "epochs": 2}, 24)
    assert set(shown) >= {"id", "name", "status", "stop_reason", "config", "metrics", "events",
                          "restarts", "cost_usd"}
    assert [(e["kind"], e["name"]) for e in shown["events"]
            if e["kind"] in ("lifecycle", "supervisor")] == [
        ("lifecycle", "start"), ("lifecycle", "end"), ("supervisor", "exit")]
    assert ("profile", "summary") in [(e["kind"], e["name"]) for e in shown["events"]]
    assert any(e["name"] == "saved" for e in shown["events"])


def test_unknown_set_key_stops_before_training_and_leaves_no_run(project: Project) -> None:
    result = project.prudent("run", "--run-id", "typo", "--set", "lrr=0.1", "--",
                             sys.executable, script("design_api.py"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "prudent: error: --set lrr: unknown key 'lrr' in config (did you mean 'lr'?); known "
        "keys: epochs, lr. "
        "Fix the spelling, or add the key to the config passed to prudent.init"]
    listed = project.prudent("runs", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []  # nothing ran


def test_a_set_key_a_configurator_style_script_never_reads_is_warned_and_recorded(
        project: Project) -> None:
    """nanoGPT's shape: the loop reads module globals; without globals().update(run.config)
    the --set value is recorded but not trained with, and prudent says so."""
    command = ["--", sys.executable, script("configurator_globals.py")]
    ignored = project.prudent("run", "--run-id", "ignored", "--set", "learning_rate=0.5",
                              *command, "--update_globals=False")
    assert ignored.returncode == 0, ignored.stderr
    assert ("prudent | ignored | warning: --set learning_rate=0.5 was not read from run.config "
            "by step 1 (1% of the 20 planned steps): the run records it but trains on the "
            "script's own value. Read it from run.config (run.config[\"learning_rate\"]) or, "
            "for configurator-style globals (nanoGPT), add globals().update(run.config) after "
            "prudent.init") in ignored.stderr
    shown = project.show("ignored")
    assert shown["config"]["learning_rate"] == 0.5 and shown["metrics"]["lr_used"] == 0.001
    (event,) = [e for e in shown["events"] if (e["kind"], e["name"]) == ("config", "unread")]
    assert event["step"] == 1 and event["payload"]["keys"] == ["learning_rate"]
    used = project.prudent("run", "--run-id", "used", "--set", "learning_rate=0.5", *command)
    assert used.returncode == 0, used.stderr
    assert "warning" not in used.stderr and project.show("used")["metrics"]["lr_used"] == 0.5


def test_checkpoints_that_cannot_be_written_stop_the_run_at_its_start_and_leave_no_run(
        project: Project) -> None:
    # a location no save can reach (here: a folder under a file; a bucket that does not
    # exist the same) is found before the first step, not after a run without checkpoints
    project.env["PRUDENT_CHECKPOINT_URL"] = "/dev/null/checkpoints"
    result = project.prudent("run", "--run-id", "nowhere", "--",
                             sys.executable, script("design_api.py"))
    assert result.returncode == 2, result.stderr
    assert "prudent: error: cannot write checkpoints to '/dev/null/checkpoints'" in result.stderr
    assert "fix checkpoint.url (PRUDENT_CHECKPOINT_URL)" in result.stderr
    # the error is the one line: no end-of-run summary of a run that never started
    assert "prudent | nowhere |" not in result.stderr + result.stdout, result.stderr
    listed = project.prudent("runs", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []  # nothing ran


def test_a_completed_run_id_started_again_trains_nothing_and_writes_nothing(
        project: Project) -> None:
    command = ["run", "--run-id", "again", "--set", "epochs=1", "--", sys.executable,
               script("design_api.py")]
    first = project.prudent(*command)
    assert first.returncode == 0, first.stderr
    before, rows = project.show("again"), _rows(project, "again")
    assert rows[0] and rows[1]
    again = project.prudent(*command)
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip() == (f"prudent | again | already completed at step "
                                    f"{before['step']}; nothing trained: give another --run-id "
                                    "to train again")
    after = project.show("again")
    assert (after["restarts"], after["status"], after["step"]) == (0, "completed", before["step"])
    assert _rows(project, "again") == rows  # not one metric row or event more


def test_a_run_completed_on_another_machine_is_not_trained_again(tmp_path, project: Project
                                                                 ) -> None:
    """A fresh home on a new machine, the checkpoints (and the run's record) in a shared
    location: the record says the run completed, so nothing is trained."""
    shared = tmp_path / "bucket"
    project.env["PRUDENT_CHECKPOINT_URL"] = str(shared)
    command = ["run", "--run-id", "done", "--set", "epochs=1", "--", sys.executable,
               script("design_api.py")]
    first = project.prudent(*command)
    assert first.returncode == 0, first.stderr
    step = project.show("done")["step"]
    new_machine = Project(tmp_path / "new-machine")
    new_machine.path.mkdir()
    new_machine.env["PRUDENT_CHECKPOINT_URL"] = str(shared)
    checkpoints = sorted(p.name for p in shared.iterdir())
    again = new_machine.prudent(*command)
    assert again.returncode == 0, again.stderr
    assert f"already completed at step {step}; nothing trained" in again.stderr
    assert sorted(p.name for p in shared.iterdir()) == checkpoints  # no checkpoint more
    assert not (new_machine.path / ".prudent" / "runs" / "done").exists()  # nothing ran


def _rows(project: Project, run_id: str) -> tuple[int, int]:
    """The run's events and metric rows in the project's store."""
    store = Store(f"sqlite:///{project.path / '.prudent' / 'prudent.db'}")
    try:
        return len(store.events(run_id)), store.count_metrics(run_id)
    finally:
        store.close()


def _start_slow(project: Project, run_id: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", run_id, "--", sys.executable,
         script("slow_train.py")], cwd=project.path, env=project.env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "READY"
    return process


@pytest.mark.parametrize(("signum", "code", "reason"), [(signal.SIGTERM, 75, "preempted"),
                                                        (signal.SIGINT, 130, "interrupted")])
def test_signal_to_supervisor_stops_training_cleanly(project: Project, signum: int, code: int,
                                                     reason: str) -> None:
    process = _start_slow(project, "sig")
    process.send_signal(signum)
    assert process.wait(timeout=60) == code
    process.communicate()
    shown = project.show("sig")
    assert (shown["status"], shown["stop_reason"]) == ("stopped", reason)
    assert shown["step"] >= 1 and shown["metrics"]["loss"] == 1.0


def test_sigterm_before_the_script_reaches_prudent_init_is_a_preemption(
        project: Project) -> None:
    # a spot VM's notice can come while the script still imports torch or loads its data,
    # before prudent.init installs its handler: the child dies of the signal itself. The
    # launch recipes requeue or recover on exit 75 only, so 143 would lose the job.
    code = ("import sys, time\nprint('STARTING', flush=True)\ntime.sleep(60)\n"
            "import prudent\nprudent.init(name='late')\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "early", "--", sys.executable,
         "-c", code], cwd=project.path, env=project.env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "STARTING"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 75
    _, err = process.communicate()
    assert "before the script could handle it" in err
    shown = project.show("early")
    assert (shown["status"], shown["stop_reason"]) == ("stopped", "preempted")


def test_child_killed_without_warning_is_recorded_as_failed(project: Project) -> None:
    process = _start_slow(project, "killed")
    time.sleep(2.0)  # ~2 s of training at 0.02 s a step; at most the last second may be lost
    (child,) = psutil.Process(process.pid).children()
    child.kill()
    assert process.wait(timeout=60) == 128 + signal.SIGKILL
    process.communicate()
    shown = project.show("killed")
    assert (shown["status"], shown["stop_reason"]) == ("failed", "error")
    assert "killed by SIGKILL" in shown["events"][-1]["message"]
    assert shown["metrics"]["loss"] == 1.0
    store = Store(f"sqlite:///{project.path / '.prudent' / 'prudent.db'}")
    assert len(store.metric_series("killed", "loss")) >= 20  # >= 1 s of the ~2 s survived
    store.close()


def test_script_that_raises_is_failed_with_its_error(project: Project) -> None:
    code = ("import prudent\nrun = prudent.init(name='oops')\nwith run:\n"
            "    run.step(loss=1.0)\n    raise ValueError('bad batch shape')\n")
    result = project.prudent("run", "--run-id", "oops", "--", sys.executable, "-c", code)
    assert result.returncode == 1 and "ValueError: bad batch shape" in result.stderr
    shown = project.show("oops")
    assert (shown["status"], shown["stop_reason"]) == ("failed", "error")
    (end,) = [e for e in shown["events"] if (e["kind"], e["name"]) == ("lifecycle", "end")]
    assert end["message"] == "ValueError: bad batch shape"


def test_missing_command_is_exit_127_and_recorded(project: Project) -> None:
    result = project.prudent("run", "--run-id", "nocmd", "--", "definitely-not-a-program")
    assert result.returncode == 127 and "cannot start 'definitely-not-a-program'" in result.stderr
    assert "is not on PATH: activate the environment it is installed in" in result.stderr
    (project.path / "train.py").write_text("print('hi')\n")  # a script given as the program
    script_only = project.prudent("run", "--run-id", "noint", "--", "train.py")
    assert script_only.returncode == 127, script_only.stderr
    assert ("(train.py is a script, not a program: give its interpreter first, prudent run -- "
            "python train.py)") in script_only.stderr
    assert project.show("nocmd")["status"] == "failed"


def test_an_early_stopped_run_is_completed_and_the_code_after_it_runs(project: Project) -> None:
    project.env["PRUDENT_CONSOLE"] = "plain"
    (project.path / "prudent.yaml").write_text(
        "monitor: {rules: {early_stopping: {patience: 4}}}\n")
    done = project.prudent("run", "--run-id", "early", "--", sys.executable,
                           script("early_stop_then_export.py"))
    assert done.returncode == 0, done.stderr
    after = json.loads((project.path / "after.json").read_text())
    assert after == {"status": "completed", "stop_reason": "rule:early_stopping",
                     "stopped_early": True, "epoch": 7}  # 4 evaluations after the best (3rd),
    # once that 7th epoch's end has run
    shown = project.show("early")
    assert (shown["status"], shown["stop_reason"], shown["exit_code"]) == (
        "completed", "rule:early_stopping", 0)
    assert "completed (rule:early_stopping)" in done.stderr
    (project.path / "after.json").unlink()
    sick = project.prudent("run", "--run-id", "sick", "--set", "nan_at=5", "--", sys.executable,
                           script("early_stop_then_export.py"))
    assert sick.returncode == 3, sick.stderr  # something is wrong: today's code, and no export
    assert not (project.path / "after.json").exists()


def test_a_preemption_in_the_code_after_the_block_is_resumed_to_finish_that_code(
        project: Project) -> None:
    """SIGTERM while the completed run's script exports its model: not "before prudent.init"
    and not finished either. Exit 75, and the next launch runs the script again (from its
    newest checkpoint) so that the export is done; then it stays completed."""
    import signal
    import subprocess
    import time

    command = [sys.executable, "-m", "prudent", "run", "--run-id", "cut", "--set", "epochs=3",
               "--set", "export_s=60", "--", sys.executable, script("early_stop_then_export.py")]
    supervisor = subprocess.Popen(command, cwd=project.path, env=project.env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (project.path / "exporting").exists():
        assert supervisor.poll() is None and time.monotonic() < deadline, supervisor.communicate()
        time.sleep(0.05)
    supervisor.send_signal(signal.SIGTERM)
    _, err = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 75, err
    assert "after its run completed, in the code after `with run:`" in err, err
    assert "had not reached prudent.init" not in err
    assert not (project.path / "after.json").exists()  # the export was cut
    again = project.prudent("run", "--run-id", "cut", "--set", "epochs=3", "--set",
                            "export_s=0.1", "--", sys.executable,
                            script("early_stop_then_export.py"))
    assert again.returncode == 0, again.stderr
    assert json.loads((project.path / "after.json").read_text())["status"] == "completed"
    shown = project.show("cut")
    assert (shown["status"], shown["exit_code"]) == ("completed", 0)
    third = project.prudent("run", "--run-id", "cut", "--set", "epochs=3", "--",
                            sys.executable, script("early_stop_then_export.py"))
    assert third.returncode == 0 and "already completed" in third.stderr, third.stderr
