"""``prudent preflight`` on real scripts: each bug fails the check that names it; digits passes."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.e2e.conftest import ROOT, Project, script

# script -> (the check that must fail, the checks allowed to fail with it)
BUGS = {
    "preflight_eval_crash.py": ("runs", {"runs"}),
    "preflight_resume_crash.py": ("resume", {"resume"}),
    "preflight_no_zero_grad.py": ("overfit", {"overfit"}),
    "preflight_frozen_layer.py": ("gradients", {"gradients", "overfit"}),  # it cannot overfit
    "preflight_nan_sample.py": ("finite", {"finite"}),
    "preflight_last_batch.py": ("batches", {"batches", "runs"}),  # the crash is a crash too
    "preflight_val_dtype.py": ("batches", {"batches", "runs"}),
}
FAST = {"preflight_resume_crash.py", "preflight_last_batch.py"}


def preflight(project: Project, *args: str) -> tuple[int, dict[str, Any]]:
    result = project.prudent("preflight", "--json", *args, timeout=600)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def statuses(document: dict[str, Any]) -> dict[str, str]:
    return {check["id"]: check["status"] for check in document["checks"]}


def test_the_digits_example_passes_with_a_cost_projection(project: Project) -> None:
    code, document = preflight(project, "--instance", "aws:g5.xlarge", "--",
                               sys.executable, str(ROOT / "examples" / "digits.py"))
    assert code == 0 and document["ok"], json.dumps(document["checks"], indent=1)
    assert set(statuses(document).values()) == {"pass"}
    projection = document["projection"]
    assert projection["num_epochs"] == 10 and projection["batches_per_epoch"] == 45
    assert projection["cost_usd"] > 0 and "aws:g5.xlarge" in projection["price"]["source"]
    assert not (project.path / ".prudent").exists()  # smoke runs live in a throwaway home


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in BUGS])
def test_each_bug_fails_the_check_that_names_it(project: Project, name: str) -> None:
    expected, allowed = BUGS[name]
    code, document = preflight(project, "--", sys.executable, script(name))
    failed = {k for k, v in statuses(document).items() if v == "fail"}
    assert code == 1 and not document["ok"]
    assert expected in failed and failed <= allowed, json.dumps(document["checks"], indent=1)


def test_a_script_that_never_calls_init_is_told_so(project: Project) -> None:
    result = project.prudent("preflight", "--", sys.executable, script("preflight_no_init.py"),
                             timeout=300)
    assert result.returncode == 1
    assert "preflight_no_init.py never called prudent.init()" in result.stdout
    assert "add `run = prudent.init(" in result.stdout


def test_an_unknown_instance_is_refused_before_anything_runs(project: Project) -> None:
    result = project.prudent("preflight", "--instance", "aws:g5.xlarg", "--", sys.executable,
                             script("preflight_no_init.py"))
    assert result.returncode == 2 and "did you mean aws:g5.xlarge" in result.stderr


def test_a_script_that_selects_cuda_on_a_machine_without_it_is_not_a_cloud_failure(
        project: Project) -> None:
    code, document = preflight(project, "--", sys.executable, script("preflight_cuda_only.py"))
    runs = next(c for c in document["checks"] if c["id"] == "runs")
    assert runs["status"] == "untestable", runs
    assert runs["summary"].startswith("cannot test here: preflight_cuda_only.py selects cuda")
    assert "in the cloud" not in runs["fix"] and "run.device" in runs["fix"]
    assert code == 1 and not document["ok"]  # nothing was tested: not a pass either
    text = project.prudent("preflight", "--", sys.executable, script("preflight_cuda_only.py"),
                           timeout=600)
    assert "could not be tested on this machine" in text.stdout
    assert "not ready for the cloud" not in text.stdout


def test_a_terminated_preflight_leaves_no_smoke_run_behind(project: Project) -> None:
    """``timeout 60 prudent preflight …`` on a script deep in a long evaluation: preflight
    exits 143 at once and its smoke runs are gone, not training on as orphans."""
    import signal
    import subprocess
    import time

    import psutil

    preflight = subprocess.Popen(
        [sys.executable, "-m", "prudent", "preflight", "--", sys.executable,
         script("preflight_long_eval.py")], cwd=project.path, env=project.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = project.path / "evaluating.pid"
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and preflight.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), "no smoke run reached its evaluation"
    smoke = [psutil.Process(int(pid)) for pid in marker.read_text().split()]
    preflight.send_signal(signal.SIGTERM)
    assert preflight.wait(timeout=30) == 128 + signal.SIGTERM
    gone, alive = psutil.wait_procs(smoke, timeout=10)
    assert not alive, [p.cmdline() for p in alive]  # before: it evaluated on for minutes
