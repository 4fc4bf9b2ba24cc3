"""Fault tolerance: complete, atomic, checksummed, asynchronous checkpoints and exact resume.

``Checkpointer`` is imported on first use: it needs torch, and the command line (which
reads ``CheckpointSettings``) should not pay for importing it.
"""

from __future__ import annotations

from prudent.checkpoint.settings import CheckpointSettings
from prudent.kernel.lazy import lazy_exports

__all__ = ["CheckpointSettings", "Checkpointer"]


__getattr__ = lazy_exports(__name__, {"Checkpointer": "prudent.checkpoint.manager"})
