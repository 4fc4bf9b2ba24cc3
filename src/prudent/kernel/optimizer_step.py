"""An optimizer's next ``step()`` replaced once: how an update is skipped (loss_spike's skip
of an outlier, a rollback's dropped batches) without touching the optimizer's class.

``step`` becomes an instance attribute over the method, or over an LR scheduler's wrapper of
it (an instance attribute the scheduler checks); the replacement puts back what was there when
it is called, or when :func:`put_back_step` finds it still unused (a GradScaler that skipped
the step itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["put_back_step", "replace_next_step"]


def replace_next_step(optimizer: Any, name: str, then: Callable[[], Any] | None = None) -> None:
    """The next ``optimizer.step()`` calls ``then`` (nothing by default) instead; ``name``
    tells whose replacement it is (:func:`put_back_step`)."""
    previous = vars(optimizer).get("step")

    def once(*args: Any, **kwargs: Any) -> Any:
        _restore(optimizer, previous)
        return None if then is None else then()

    once.__name__ = name
    once.previous = previous  # type: ignore[attr-defined]
    optimizer.step = once


def put_back_step(optimizer: Any, name: str) -> None:
    """Undo ``name``'s replacement if it was never called."""
    step = vars(optimizer).get("step")
    if getattr(step, "__name__", "") == name:
        _restore(optimizer, step.previous)


def _restore(optimizer: Any, previous: Any) -> None:
    if previous is None:
        vars(optimizer).pop("step", None)
    else:
        optimizer.step = previous
