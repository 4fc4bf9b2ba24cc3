"""Every random number generator a training step can touch, captured and restored together.

The states are plain tensors, tuples and numbers, so a checkpoint holding them loads with
``torch.load(weights_only=True)`` (NumPy's state is stored as a tensor, not an ndarray:
pickled ndarrays are what breaks other tools' resume under ``weights_only``).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["capture_rng", "kept_torch_state", "restore_rng", "torch_generator_keeper"]


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy_state = _numpy_state()
    if numpy_state is not None:
        state["numpy"] = numpy_state
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def torch_generator_keeper() -> Callable[[], Any]:
    """What the kernel calls at every step's end to keep torch's generator as it is: a clone of
    the generator, ~5 us a step cheaper than its state tensor (a 5 kB ByteTensor allocated
    and freed at each step), read by :func:`kept_torch_state` only when a checkpoint needs it
    (torch before 2.4 has no ``clone_state``: the state tensor then)."""
    return getattr(torch.default_generator, "clone_state", torch.get_rng_state)


def kept_torch_state(kept: Any) -> Any:
    """torch's generator state, as ``torch.get_rng_state`` gives it, from what the keeper
    (:func:`torch_generator_keeper`) kept."""
    return kept.get_state() if isinstance(kept, torch.Generator) else kept


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
