"""Tracebacks trimmed to the user's own frames: the lines of their script that matter.

A smoke process reports its exception as frames (from the probe); a process that crashed
before ``prudent.init`` only left its stderr, which is parsed instead.
"""

from __future__ import annotations

import os
import re
import sysconfig
from typing import Any

__all__ = ["format_frames", "is_user_file", "parse_stderr", "user_frames"]

_LIBRARY_DIRS = tuple({os.path.realpath(p) for p in (
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"]) if p})
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')


def is_user_file(path: str) -> bool:
    """Not prudent, not the standard library, not an installed package."""
    real = os.path.realpath(path)
    if path.startswith("<") or real.startswith(_PACKAGE_DIR + os.sep):
        return False
    return not any(real.startswith(d + os.sep) for d in _LIBRARY_DIRS) and \
        "site-packages" not in real and "dist-packages" not in real


def user_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user's frames; all frames when none is the user's (better than nothing)."""
    mine = [f for f in frames if is_user_file(f["file"])]
    return mine or frames


def format_frames(exception: dict[str, Any], limit: int = 8) -> str:
    """``File "train.py", line 40, in evaluate`` lines and the exception, like Python's."""
    lines = []
    for frame in user_frames(exception.get("frames", []))[-limit:]:
        lines.append(f'File "{frame["file"]}", line {frame["line"]}, in {frame["function"]}')
        if frame.get("code"):
            lines.append(f"    {frame['code']}")
    lines.append(f"{exception['type']}: {exception['message']}")
    return "\n".join(lines)


def parse_stderr(text: str) -> dict[str, Any] | None:
    """The last Python traceback printed in ``text``, as frames (None when there is none)."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    frames: list[dict[str, Any]] = []
    final = ""
    for line in text[start:].splitlines()[1:]:
        match = _FRAME.match(line)
        if match:
            frames.append({"file": match["file"], "line": int(match["line"]),
                           "function": match["function"], "code": None})
        elif line.startswith("    ") and frames and frames[-1]["code"] is None:
            frames[-1]["code"] = line.strip()
        elif line and not line.startswith(" "):
            final = line
            break
    kind, _, message = final.partition(": ")
    return {"type": kind or "Error", "message": message, "frames": frames}
