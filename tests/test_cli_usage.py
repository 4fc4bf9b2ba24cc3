"""Usage errors on the real command line: click's usage line and message, exit 2, no traceback.

Each case runs ``python -m prudent`` in a subprocess, so it goes through the installed typer
(and whichever copy of click it raises) exactly as a user's shell does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# click's wording moved between versions ("No such option: --bogus", "No such option '--bogus'.").
NO_SUCH_OPTION = r"No such option:? '?--bogus"

UNKNOWN_COMMAND = [
    (["reprot", "x"], "No such command 'reprot'"),
    (["policy", "chek"], "No such command 'chek'"),
]
UNKNOWN_OPTION = [
    (["runs", "--bogus"], NO_SUCH_OPTION),
    (["show", "r1", "--bogus"], NO_SUCH_OPTION),
    (["profile", "r1", "--bogus"], NO_SUCH_OPTION),
    (["catalog", "--bogus"], NO_SUCH_OPTION),
    (["cost", "--bogus"], NO_SUCH_OPTION),
    (["study", "s1", "--bogus"], NO_SUCH_OPTION),
    (["policy", "check", "--bogus"], NO_SUCH_OPTION),
]
MISSING_ARGUMENT = [
    (["show"], "Missing argument"),
    (["profile"], "Missing argument"),
    (["study"], "Missing argument"),
    (["replay"], "Missing argument"),
    (["tune", "--", "python", "train.py"], "Missing option '--space'"),
]
# run, tune, preflight and replay pass unknown options on to the training command, so a
# mistyped option after the command's first word is the script's; a bad value for one of
# prudent's own is a usage error, and so is a dash-word where the command should start.
BAD_VALUE = [
    (["runs", "-n", "abc"], "Invalid value for '--limit'"),
    (["runs", "--limit", "0"], "Invalid value for '--limit'"),
    (["run", "--max-restarts", "abc", "--", "python", "train.py"],
     "Invalid value for '--max-restarts'"),
    # a mistyped option of prudent's own, before the command: never run as a program, and the
    # verb's closest option named
    (["run", "--max-restart", "2", "--", "python", "train.py"],
     r"'--max-restart' is not an option of .*prudent run \(did you mean --max-restarts\?"),
    (["run", "--budget", "5", "--", "python", "train.py"], "did you mean --budget-usd"),
    (["tune", "--space", "s.yaml", "--objective", "val_loss", "--trails", "4", "--", "python",
      "train.py"], r"'--trails' is not an option of .*prudent tune \(did you mean --trials\?"),
    (["preflight", "--step", "4", "--", "python", "train.py"],
     r"'--step' is not an option of .*prudent preflight \(did you mean --steps\?"),
    (["replay", "r1", "--stp", "3"], "did you mean --step"),
    (["run", "--zzz", "--", "python", "train.py"],
     r"'--zzz' is not an option of .*prudent run \(see .*prudent run --help\)"),
    (["tune", "--space", "space.yaml", "--trials", "abc", "--", "python", "train.py"],
     "Invalid value for '--trials'"),
    (["preflight", "--steps", "abc", "--", "python", "train.py"], "Invalid value for '--steps'"),
    (["replay", "r1", "--step", "abc"], "Invalid value for '--step'"),
]


def _cases(rows: list[tuple[list[str], str]]) -> list:
    return [pytest.param(args, message, id=" ".join(args)) for args, message in rows]


def _prudent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
    return subprocess.run([sys.executable, "-m", "prudent", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def _unboxed(text: str) -> str:
    """The text without rich's panel borders and line wrapping, so a message reads as one line."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def _assert_usage_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert re.search(r"^\s*Usage: .*prudent", result.stderr, re.MULTILINE), result.stderr
    assert re.search(message, _unboxed(result.stderr)), result.stderr


@pytest.mark.parametrize(("args", "message"), _cases(UNKNOWN_COMMAND))
def test_unknown_command_prints_usage_and_exits_2(tmp_path, args, message):
    _assert_usage_error(_prudent(tmp_path, *args), message)


@pytest.mark.parametrize(("args", "message"), _cases(UNKNOWN_OPTION))
def test_unknown_option_prints_usage_and_exits_2(tmp_path, args, message):
    _assert_usage_error(_prudent(tmp_path, *args), message)


@pytest.mark.parametrize(("args", "message"), _cases(MISSING_ARGUMENT))
def test_missing_argument_prints_usage_and_exits_2(tmp_path, args, message):
    _assert_usage_error(_prudent(tmp_path, *args), message)


@pytest.mark.parametrize(("args", "message"), _cases(BAD_VALUE))
def test_bad_value_prints_usage_and_exits_2(tmp_path, args, message):
    _assert_usage_error(_prudent(tmp_path, *args), message)


def test_usage_error_writes_nothing(tmp_path):
    _prudent(tmp_path, "runs", "--bogus")
    assert list(tmp_path.iterdir()) == []


def test_prudent_error_is_still_one_line_and_exit_2(tmp_path):
    result = _prudent(tmp_path, "show", "no-such-run")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("prudent: error: no run 'no-such-run'"), result.stderr
    assert "Traceback" not in result.stderr


def test_help_exits_0(tmp_path):
    result = _prudent(tmp_path, "runs", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout


def test_show_and_runs_print_messages_with_brackets_as_text(tmp_path):
    """An event quoting gloo's "[/__w/pytorch/...]" (a lost rank) crashed `prudent show` on
    Rich's markup; names and stop reasons are the user's text too."""
    import json
    import time

    from prudent.store import Store

    (tmp_path / ".prudent").mkdir()
    store = Store(f"sqlite:///{tmp_path / '.prudent' / 'prudent.db'}")
    store.create_run("r1", "[bold]name", command="python train.py", host="h")
    store.add_events([{"run_id": "r1", "step": 41, "kind": "lifecycle", "name": "rank_lost",
                       "message": "lost ([/__w/pytorch/gloo/pair.cc:553] Connection closed)",
                       "payload": json.dumps({}), "wall": time.time()}])
    store.close()
    env = {**os.environ, "PRUDENT_HOME": str(tmp_path / ".prudent"), "COLUMNS": "200"}
    shown = subprocess.run([sys.executable, "-m", "prudent", "show", "r1"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "[/__w/pytorch/gloo/pair.cc:553] Connection closed" in shown.stdout
    assert "[bold]name" in shown.stdout
    listed = subprocess.run([sys.executable, "-m", "prudent", "runs"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "r1" in listed.stdout, listed.stderr


def test_version_prints_the_packages_version(tmp_path):
    import prudent

    result = _prudent(tmp_path, "--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"prudent {prudent.__version__}")
