from __future__ import annotations

import sys

import pytest

from tests.e2e.conftest import ROOT, Project


@pytest.mark.slow
def test_digits_example_under_prudent_run_reaches_95_percent(project: Project) -> None:
    result = project.prudent("run", "--run-id", "digits-e2e", "--", sys.executable,
                             str(ROOT / "examples" / "digits.py"), timeout=300)
    assert result.returncode == 0, result.stderr
    shown = project.show("digits-e2e")
    assert shown["status"] == "completed" and shown["stop_reason"] is None
    assert shown["metrics"]["val_acc"] >= 0.95
    assert shown["duration_s"] < 60
