"""Every random number generator a training step can touch, captured and restored together.

The states are plain tensors, tuples and numbers, so a checkpoint holding them loads with
``torch.load(weights_only=True)`` (NumPy's state is stored as a tensor, not an ndarray:
pickled ndarrays are what breaks other tools' resume under ``weights_only``).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy_state = _numpy_state()
    if numpy_state is not None:
        state["numpy"] = numpy_state
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def host_generators() -> dict[str, Any]:
    """Python's and NumPy's global generators (NumPy's only where the script imported it)."""
    state: dict[str, Any] = {"python": random.getstate()}
    if "numpy" in sys.modules:
        numpy_state = _numpy_state()
        if numpy_state is not None:
            state["numpy"] = numpy_state
    return state


def restore_rng(state: dict[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        _set_numpy_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state() -> tuple[Any, ...] | None:
    try:
        import numpy as np
    except ImportError:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))


def _set_numpy_state(state: tuple[Any, ...]) -> None:
    import numpy as np

    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
