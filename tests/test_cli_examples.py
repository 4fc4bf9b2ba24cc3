"""The example in every command's help works as written.

Each command's help ends with one paragraph ``Example: prudent ...``. The slow test runs every
one of them in a shell, as a user would paste it, in a project prepared with a tiny real
training script (``train.py``, seconds on a CPU), a search space, and a SkyPilot price file
at ``~/.sky/catalogs/v7/aws/vms.csv``. They run in ``ORDER``: ``prudent run`` makes the run
``baseline`` that ``show``, ``profile``, ``report`` and ``replay`` read, ``tune`` the study
that ``study`` reads.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
# Every command, in the order its example runs ("" is `prudent` itself).
ORDER = ["run", "show", "profile", "report", "replay", "runs", "cost", "tune", "study",
         "preflight", "catalog", "catalog import", "policy", "policy check", "ui", "store",
         "store check", "store repair", ""]
# The exit code a user expects from an example, where it is not 0.
EXIT_CODES: dict[str, int] = {}

TRAIN = '''\
"""A tiny real training script: an MLP on generated data, four epochs, seconds on a CPU."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.set_num_threads(1)
run = prudent.init(config={"lr": 0.05, "hidden": 16, "epochs": 4})
x = torch.randn(640, 10, generator=torch.Generator().manual_seed(0))
y = (x[:, :5].sum(1) > 0).long()
train = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=32, shuffle=True,
                   generator=torch.Generator().manual_seed(1))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, run.config["hidden"]), nn.ReLU(),
                      nn.Linear(run.config["hidden"], 2))
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        for xb, yb in run.batches(train):
            loss = F.cross_entropy(model(xb), yb)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
        with torch.no_grad():
            run.log(val_acc=(model(x[512:]).argmax(1) == y[512:]).float().mean().item())
'''
SPACE = """\
lr: {type: float, low: 0.001, high: 0.1, log: true}
hidden: {type: int, low: 8, high: 32}
"""


def _commands(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(path, click command) of the CLI: the group itself, its commands and subcommands."""
    import typer.main

    from prudent.cli import app

    command = command or typer.main.get_command(app)
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _examples(help_text: str | None) -> list[str]:
    return [paragraph.removeprefix("Example: ")
            for paragraph in inspect.cleandoc(help_text or "").split("\n\n")
            if paragraph.startswith("Example:")]


def examples() -> dict[str, str]:
    """Each command's one example, read from its help."""
    found = {}
    for path, command in _commands():
        (example,) = _examples(command.help) or [""]
        found[path] = example
    return found


@pytest.mark.parametrize("path", [pytest.param(p, id=p or "prudent") for p, _ in _commands()])
def test_every_command_shows_one_example_of_itself_in_its_help(path: str) -> None:
    """One paragraph ``Example: prudent <the command> ...``, printed by --help, and in ORDER
    so that the slow test runs it."""
    from typer.testing import CliRunner

    from prudent.cli import app

    command = dict(_commands())[path]
    found = _examples(command.help)
    assert len(found) == 1, f"prudent {path}: want one 'Example: prudent ...' paragraph: {found}"
    assert f"{found[0]} ".startswith(f"prudent {path} ".replace("  ", " ")), found[0]
    shown = CliRunner().invoke(app, [*path.split(), "--help"], prog_name="prudent",
                               env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert f"Example: {found[0]}" in shown.output
    assert path in ORDER


def _project(root: Path) -> tuple[Path, dict[str, str]]:
    """The project folder and the shell's environment: `prudent` and `python` on PATH are this
    interpreter's, HOME is the project (SkyPilot's catalog under ~/.sky), no PRUDENT_*."""
    project, shims = root / "project", root / "bin"
    project.mkdir()
    shims.mkdir()
    for name, command in (("python", ""), ("prudent", " -m prudent")):
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}"{command} "$@"\n')
        shim.chmod(0o755)
    (project / "train.py").write_text(TRAIN)
    (project / "space.yaml").write_text(SPACE)
    (project / "prudent.yaml").write_text("checkpoint: {every: 16steps}\n")
    skypilot = project / ".sky" / "catalogs" / "v7" / "aws"
    skypilot.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "cost" / "skypilot" / "v9" / "aws" / "vms.csv", skypilot)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
    env.update(PATH=f"{shims}{os.pathsep}{env.get('PATH', '')}", HOME=str(project),
               PRUDENT_CONSOLE="plain")
    return project, env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(example: str, project: Path, env: dict[str, str]) -> tuple[int, str]:
    """`prudent ui`: it serves the dashboard until Ctrl-C, then exits. The example's port is
    swapped for a free one (another test, or a person, may hold 8765)."""
    port = _free_port()
    command = re.sub(r"--port \d+", f"--port {port}", example)
    server = subprocess.Popen(["sh", "-c", f"exec {command}"], cwd=project, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    status, deadline = None, time.monotonic() + 60
    try:
        while status != 200 and server.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    status = page.status
            except OSError:
                time.sleep(0.2)
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    return (server.returncode if status == 200 else -1), f"HTTP {status}\n{output}"


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, float]]:
    """Every example run once, in ORDER: (exit code, its output, seconds)."""
    project, env = _project(tmp_path_factory.mktemp("examples"))
    results = {}
    for path in ORDER:
        example, started = examples().get(path), time.monotonic()
        if not example:
            code, output = -1, f"prudent {path} has no example in its help"
        elif path == "ui":
            code, output = _serve(example, project, env)
        else:
            done = subprocess.run(["sh", "-c", example], cwd=project, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
            code, output = done.returncode, done.stdout
        results[path] = (code, output, time.monotonic() - started)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(p, id=p or "prudent") for p in ORDER])
def test_the_example_in_the_help_runs_as_written(
        ran: dict[str, tuple[int, str, float]], path: str) -> None:
    code, output, seconds = ran[path]
    expected = EXIT_CODES.get(path, 0)
    assert code == expected, f"prudent {path}'s example exited {code}, not {expected}:\n{output}"
    assert "Traceback" not in output, output
    assert seconds < 120, f"prudent {path}'s example took {seconds:.0f} s"
