"""Faults injected for real: a small or read-only file system is a tmpfs mounted for the test
(root only: CI runs as root; elsewhere these tests skip, saying why)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Project

_MOUNTED: list[Path] = []


def mounted_tmpfs(path: Path, size: str) -> Path:
    """A tmpfs of ``size`` at ``path``, unmounted when the test ends."""
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    _MOUNTED.append(path)
    return path


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


@pytest.fixture(autouse=True)
def _unmount() -> Iterator[None]:
    yield
    while _MOUNTED:
        subprocess.run(["umount", "-l", str(_MOUNTED.pop())], check=False)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    (tmp_path / "project").mkdir()
    return Project(tmp_path / "project")
