"""``prudent.tune(...)``: ``prudent tune`` from Python."""

from __future__ import annotations

import inspect
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prudent.kernel.errors import ConfigError

__all__ = ["tune"]


def tune(fn_or_command: str | Sequence[str] | Callable[[], Any], *,
         space: str | Path | Mapping[str, Any], objective: str, direction: str = "max",
         trials: int | None = 20, workers: int = 1, timeout_s: float | None = None,
         budget_usd: float | None = None, sampler: str | None = None, pruner: str | None = None,
         study: str | None = None, storage: str | None = None,
         enqueue: Sequence[Mapping[str, Any]] = (), max_epochs: int | None = None,
         epoch_s: float | None = None, seed: int | None = None, config: str | None = None,
         warm_start: str | None = None, fixed: Mapping[str, Any] | None = None,
         max_steps: int | None = None, min_resource: int | None = None,
         heartbeat_s: int | None = None, quiet: bool = False) -> dict[str, Any]:
    """Tune a training script (a command) or an importable function; returns the summary.

    Each trial runs in its own supervised process, so a function must be importable (defined
    at the top level of a module, not in ``__main__``) and call ``prudent.init`` itself.
    ``fixed``, ``max_steps``, ``min_resource`` and ``heartbeat_s`` are ``prudent tune``'s
    ``--set``, ``--max-steps``, ``--min-resource`` and ``--heartbeat``. The
    result is the same dictionary as ``prudent study NAME --json`` (``best_params``, ...).
    Raises :class:`~prudent.ConfigError` on bad input and ``PolicyViolation`` if refused.
    """
    from prudent.cost.launch import check_launch
    from prudent.tune.strategy import DEFAULT_PRUNER, DEFAULT_SAMPLER
    from prudent.tune.tuner import TuneOptions, Tuner
    from prudent.wiring.config import load_settings

    options = TuneOptions(
        command=_command(fn_or_command), space=space if isinstance(space, Mapping) else str(space),
        objective=objective, direction=direction, trials=trials, workers=workers,
        timeout_s=timeout_s, budget_usd=budget_usd, sampler=sampler or DEFAULT_SAMPLER,
        pruner=pruner or DEFAULT_PRUNER, study=study, storage=storage,
        enqueue=[dict(c) for c in enqueue], max_epochs=max_epochs, epoch_s=epoch_s, seed=seed,
        config_path=config, warm_start=warm_start, fixed=dict(fixed or {}), max_steps=max_steps,
        min_resource=min_resource, heartbeat_s=heartbeat_s)
    settings = load_settings(config)
    tuner = Tuner(options, settings, quiet=quiet)
    check_launch(settings, kind="tune", parallel=workers)
    code = tuner.run()
    if code == 2:
        raise ConfigError(f"study {tuner.name!r} stopped: a trial showed the study cannot go "
                          "on (see the error printed above)")
    return tuner.summary


def _command(target: str | Sequence[str] | Callable[[], Any]) -> list[str]:
    if isinstance(target, str):
        return shlex.split(target)
    if not callable(target):
        return list(target)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not module or module == "__main__" or "<" in name or "." in name:
        raise ConfigError(f"prudent.tune({name or target!r}): a function must be importable "
                          "(top level of a module other than __main__): each trial runs it "
                          "in its own process; or pass the command, e.g. 'python train.py'")
    source = Path(inspect.getfile(target)).resolve()
    depth = module.count(".") + (source.name == "__init__.py")
    folder = str(source.parents[depth])  # where `import <module>` works from
    code = (f"import sys; sys.path.insert(0, {folder!r}); "
            f"from {module} import {name}; {name}()")
    return [sys.executable, "-c", code]
