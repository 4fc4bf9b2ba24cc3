"""Fault tolerance: complete, atomic, checksummed, asynchronous checkpoints and exact resume.

``Checkpointer`` is imported on first use: it needs torch, and the command line (which
reads ``CheckpointSettings``) should not pay for importing it.
"""

from __future__ import annotations

from typing import Any

from prudent.checkpoint.settings import CheckpointSettings

__all__ = ["CheckpointSettings", "Checkpointer"]


def __getattr__(name: str) -> Any:
    if name == "Checkpointer":
        from prudent.checkpoint.manager import Checkpointer

        return Checkpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
