"""What a bundle records about where it was written: versions, device, git commit, stack."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from typing import Any

__all__ = ["environment", "git_state", "user_traceback"]

GIT_TIMEOUT_S = 2.0


def environment() -> dict[str, Any]:
    """Library versions, Python, platform, host and device: what makes a replay comparable."""
    import torch

    import prudent

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "prudent": prudent.__version__, "numpy": _version("numpy")}
    device = {"cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
              "num_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        device["gpu"] = torch.cuda.get_device_name()
    return {"versions": versions, "device": device, "platform": platform.platform(),
            "host": socket.gethostname(), "pid": os.getpid(),
            "argv": list(sys.argv), "executable": sys.executable, "cwd": os.getcwd()}


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__  # type: ignore[no-any-return]
    except ImportError:
        return None


def git_state(cwd: str | None = None) -> dict[str, Any] | None:
    """The commit and whether the tree had changes, if the script runs inside a git repository.

    Each git call is bounded by a short timeout: a capture must not hang on a slow filesystem.
    """
    try:
        commit = _git(["rev-parse", "HEAD"], cwd)
        if commit is None:
            return None
        status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def _git(args: list[str], cwd: str | None) -> str | None:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=GIT_TIMEOUT_S, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def user_traceback(exc: BaseException | None) -> str | None:
    """The traceback without prudent's own frames (those of its installed package, not any
    path with "prudent" in it: a project folder named prudent keeps its frames)."""
    from prudent.kernel.context import trimmed_traceback

    return None if exc is None else trimmed_traceback(exc)
