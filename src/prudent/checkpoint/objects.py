"""What ``run.attach`` accepts, and how one object is saved and put back in place.

Shared by the checkpointer (save, resume) and by failure capture and replay, which save and
restore the same objects the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from prudent.kernel.errors import ConfigError

__all__ = ["check_saveable", "restore_object", "state_of"]


def state_of(obj: Any, deferred: bool = False) -> Any:
    """What a checkpoint keeps of ``obj``. ``deferred``: for the checkpoint writer, which
    serialises an adapter's framework files on its own thread (``deferred_state_dict``)."""
    if deferred and hasattr(obj, "deferred_state_dict"):
        return obj.deferred_state_dict()
    if isinstance(obj, torch.Generator):  # a script's own sampling generator: its state bytes
        return obj.get_state()
    return obj.state_dict() if hasattr(obj, "state_dict") else obj


def restore_object(obj: Any, saved: Any) -> None:
    """Load ``saved`` into ``obj`` in place (the script keeps its references)."""
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(saved)
    elif isinstance(obj, torch.Generator):
        obj.set_state(saved)
    elif isinstance(obj, torch.Tensor):
        with torch.no_grad():
            obj.copy_(saved)
    elif isinstance(obj, dict):
        obj.clear()
        obj.update(saved)
    elif isinstance(obj, list):
        obj[:] = saved


def check_saveable(key: str, obj: Any) -> None:
    if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
        return
    if isinstance(obj, (dict, list, torch.Tensor, torch.Generator)):
        return
    raise ConfigError(
        f"run.attach({key}=...) got a {type(obj).__name__}, which prudent cannot restore in "
        "place: attach objects with state_dict()/load_state_dict(), tensors, torch.Generator, "
        "dicts or lists")
