"""Bad input: one line naming the value and the fix, exit code 2, nothing written."""

from __future__ import annotations

import sys

import pytest

from tests.e2e.conftest import Project, script


@pytest.mark.parametrize(("yaml_text", "args", "expected"), [
    ("store: {flush_intervall_s: 1}\n", [],
     "prudent.yaml: unknown key 'store.flush_intervall_s' (did you mean "
     "'store.flush_interval_s'?); allowed: home, url, flush_interval_s"),
    ("console: {interval_s: often}\n", [],
     "prudent.yaml: console.interval_s='often' is invalid: Input should be a valid number"),
    ("", ["--set", "lr"], "--set 'lr' has no key=value: write it as --set lr=0.001"),
    ("", ["--run-id", "team/exp1"], "run id 'team/exp1' is invalid: use 1-128 letters"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
        project: Project, yaml_text: str, args: list[str], expected: str) -> None:
    if yaml_text:
        (project.path / "prudent.yaml").write_text(yaml_text)
    result = project.prudent("run", *args, "--", sys.executable, script("design_api.py"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prudent: error: ") and expected in lines[0]
    assert not (project.path / ".prudent").exists()


def test_show_unknown_run_is_exit_2(project: Project) -> None:
    project.python(script("log_many.py"), "1")
    result = project.prudent("show", "nope")
    assert result.returncode == 2 and "no run 'nope'" in result.stderr


def test_run_without_command_is_exit_2(project: Project) -> None:
    result = project.prudent("run")
    assert result.returncode == 2 and "no command to run" in result.stderr
