"""Usage errors on the real command line: click's usage line and message, exit 2, no traceback.

Each case runs ``python -m prudent`` in a subprocess, so it goes through the installed typer
(and whichever copy of click it raises) exactly as a user's shell does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    (["runs", "-n", "abc"], "Invalid value for '--limit'.*'abc'"),
    (["runs", "--limit", "0"], "Invalid value for '--limit'.*0"),
    (["run", "--max-restarts", "three", "--", "python", "train.py"],
     "Invalid value for '--max-restarts': 'three': "),
    (["run", "--max-restarts=three", "--", "python", "train.py"],
     "Invalid value for '--max-restarts': 'three': "),
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
    # prudent's own --set after the command: the script would get it, trained with the default
    (["run", "--", "python", "train.py", "--set", "lr=0.1"],
     r"'--set lr=0.1' comes after the training command, so the script would get it and "
     r"prudent would not set 'lr': put it before the command \(.*prudent run --set lr=0.1 -- "
     r"python train.py \.\.\.\)"),
    (["tune", "--space", "s.yaml", "--objective", "val_loss", "--", "python", "train.py",
      "--set=lr=0.1"], "'--set lr=0.1' comes after the training command"),
    # a far match is no hint: --stpes (the script's --steps, mistyped) is not --set
    (["run", "--stpes", "3", "--", "python", "train.py"],
     r"'--stpes' is not an option of .*prudent run \(see .*prudent run --help\)"),
    (["run", "--zzz", "--", "python", "train.py"],
     r"'--zzz' is not an option of .*prudent run \(see .*prudent run --help\)"),
    (["tune", "--space", "space.yaml", "--trials", "abc", "--", "python", "train.py"],
     "Invalid value for '--trials': 'abc'"),
    (["preflight", "--steps", "abc", "--", "python", "train.py"],
     "Invalid value for '--steps': 'abc'"),
    (["replay", "r1", "--step", "abc"], "Invalid value for '--step': 'abc'"),
]


def _cases(rows: list[tuple[list[str], str]]) -> list:
    return [pytest.param(args, message, id=" ".join(args)) for args, message in rows]


def _prudent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
    return subprocess.run([sys.executable, "-m", "prudent", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def _assert_usage_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    """click's usage line and help hint, then the same one line as any other error of prudent's."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert re.search(r"^\s*Usage: .*prudent", result.stderr, re.MULTILINE), result.stderr
    assert not re.search(r"[│╭╮╰╯]", result.stderr), result.stderr  # no rich error box
    *_, last = result.stderr.rstrip("\n").splitlines()
    assert last.startswith("prudent: error: "), result.stderr
    assert re.search(message, last), result.stderr


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
    from prudent.store.database import Store

    (tmp_path / ".prudent").mkdir()
    Store(f"sqlite:///{tmp_path / '.prudent' / 'prudent.db'}").close()
    result = _prudent(tmp_path, "show", "no-such-run")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("prudent: error: no run 'no-such-run'"), result.stderr
    assert "Traceback" not in result.stderr


def test_reading_commands_on_a_fresh_home_say_so_and_make_no_store(tmp_path):
    """A mistyped PRUDENT_HOME must not leave an empty store behind a `prudent show`."""
    for args in (["show", "latest"], ["profile", "latest"]):
        result = _prudent(tmp_path, *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("prudent: error: no run store at "), result.stderr
        assert "PRUDENT_HOME" in result.stderr
    listed = _prudent(tmp_path, "runs")
    assert listed.returncode == 0 and listed.stdout.startswith("no runs yet"), listed
    assert _prudent(tmp_path, "runs", "--json").stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []


def test_help_exits_0(tmp_path):
    result = _prudent(tmp_path, "runs", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout


def test_show_and_runs_print_messages_with_brackets_as_text(tmp_path):
    """An event quoting gloo's "[/__w/pytorch/...]" (a lost rank) crashed `prudent show` on
    Rich's markup; names and stop reasons are the user's text too."""
    import json
    import time

    from prudent.store.database import Store

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


def _commands(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the CLI, the group itself and the subgroups' commands included."""
    import typer.main

    from prudent.cli import app

    command = command or typer.main.get_command(app)
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _help(*path: str) -> str:
    from typer.testing import CliRunner

    from prudent.cli import app

    result = CliRunner().invoke(app, [*path, "--help"], prog_name="prudent")
    assert result.exit_code == 0, result.output
    return result.output


COMMANDS = [pytest.param(path, id=" ".join(path) or "prudent") for path in _commands()]


@pytest.mark.parametrize("path", COMMANDS)
def test_help_shows_no_python_type_labels(path):
    """typer >= 0.26 writes each parameter's Python type (<bool>, <str>, <list[str]>) next to
    it, --help's own included; a user reads names and metavars (RUN, FILE, N), as click does."""
    shown = _help(*path)
    assert not re.search(r"<(bool|str|int|float|list\[\w+\]|int range|float range|path)>",
                         shown), shown


@pytest.mark.parametrize("path", COMMANDS)
def test_usage_line_names_arguments_the_same_way(path):
    """Arguments upper case, an optional one in one pair of brackets: `[RUN]`, never `[[RUN]]`,
    and never typer's `{RUN}` beside a lower-case `{name}`."""
    (usage,) = [line for line in _help(*path).splitlines() if "Usage:" in line]
    assert "{" not in usage and "[[" not in usage, usage
    words = usage.split("[OPTIONS]", 1)[-1].replace("[", " ").replace("]", " ").split()
    assert all(word.rstrip(".") == word.rstrip(".").upper() for word in words), usage


@pytest.mark.parametrize("path", COMMANDS)
def test_every_option_that_takes_a_value_names_it(path):
    """One vocabulary of metavars (N, FILE, USD, SECONDS, CLOUD:INSTANCE, ...), never the
    option's own name shouted back (`--price-per-hour PRICE_PER_HOUR`)."""
    import typer.main

    from prudent.cli import app

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    unnamed = [param.opts[0] for param in command.params
               if param.param_type_name == "option" and not getattr(param, "is_flag", False)
               and param.metavar is None]
    assert unnamed == [], unnamed


@pytest.mark.parametrize("path", COMMANDS)
def test_help_names_no_source_file(path):
    """`tune --help` once said "default: tune/strategy.py's, now tpe": a user cannot know it."""
    shown = _help(*path)
    assert not re.search(r"\w+/\w+\.py\b", shown), shown
    assert "strategy.py" not in shown


@pytest.mark.parametrize("path", [p for p in COMMANDS if p.values[0]])
def test_description_paragraphs_have_no_line_break(path):
    """Rich help keeps a docstring's single line breaks: one inside a sentence is printed as a
    broken line (`report`'s did). Paragraphs are separated by a blank line instead."""
    import inspect

    import typer.main

    from prudent.cli import app

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
        assert "\n" not in paragraph, (path, paragraph)


def test_report_description_reads_as_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
    result = subprocess.run([sys.executable, "-m", "prudent", "report", "--help"], cwd=tmp_path,
                            env={**env, "COLUMNS": "200"}, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert ("One HTML file with a run's (or a study's) curves, events, profile and cost."
            in lines), result.stdout


def test_a_usage_error_and_a_prudent_error_read_alike(tmp_path):
    """One error style: the last line of stderr is `prudent: error: ...`, exit 2, for a bad
    flag (click's usage error) as for a run that does not exist (prudent's own)."""
    for args in (["runs", "--bogus"], ["show", "no-such-run"], ["report"]):
        result = _prudent(tmp_path, *args)
        *_, last = result.stderr.rstrip("\n").splitlines()
        assert (result.returncode, last[:16]) == (2, "prudent: error: "), result.stderr
        assert not re.search(r"[│╭╮╰╯]", result.stderr), result.stderr


def test_show_gives_a_resumed_runs_attempts_beside_its_duration():
    # relaunched a day later, the run's duration spans the wait: each attempt's own time too
    from prudent.cli import _attempts_text

    resumed = {"cost": {"by_attempt": [{"seconds": 8.2}, {"seconds": 16.6}]}}
    assert _attempts_text(resumed) == " (2 attempts: 0:00:08 + 0:00:17)"
    assert _attempts_text({"cost": {"by_attempt": [{"seconds": 3.0}]}}) == ""
    assert _attempts_text({"cost": None}) == ""
