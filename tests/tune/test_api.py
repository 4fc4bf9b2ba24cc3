from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import prudent
from prudent.kernel.errors import ConfigError
from prudent.tune.api import _command

SCRIPT = str(Path(__file__).parents[1] / "e2e" / "scripts" / "tune_train.py")


def test_prudent_tune_runs_a_study_from_python_and_returns_its_summary(home: Path) -> None:
    summary = prudent.tune([sys.executable, SCRIPT], objective="val_acc", trials=1,
                           pruner="none", study="api", quiet=True,
                           space={"lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True},
                                  "epochs": {"type": "categorical", "choices": [1]}})
    assert [t["state"] for t in summary["trials"]] == ["complete"]
    assert summary["best_params"]["epochs"] == 1 and 0.01 <= summary["best_params"]["lr"] <= 0.1
    assert summary["best_value"] == summary["trials"][0]["value"] > 0.4
    assert (home / "studies" / "api.journal").is_file()


def test_a_function_must_be_importable_to_be_tuned() -> None:
    def local() -> None: ...

    with pytest.raises(ConfigError, match="a function must be importable"):
        _command(local)
    command = _command(shutil.get_terminal_size)  # importable: each trial runs it in a process
    assert command[:2] == [sys.executable, "-c"]
    assert "from shutil import get_terminal_size; get_terminal_size()" in command[2]
    assert _command("python train.py --fast") == ["python", "train.py", "--fast"]
