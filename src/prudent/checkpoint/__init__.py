"""Fault tolerance: complete, atomic, checksummed, asynchronous checkpoints and exact resume."""

from __future__ import annotations

from prudent.checkpoint.manager import Checkpointer
from prudent.checkpoint.settings import CheckpointSettings

__all__ = ["CheckpointSettings", "Checkpointer"]
