"""prudent: common-sense guardrails for training ML models in the cloud.

Five lines around your own loop::

    run = prudent.init(name="digits", config={"lr": 1e-3, "epochs": 5})
    run.attach(model=model, optimizer=opt)
    with run:
        for epoch in run.epochs(run.config["epochs"]):
            for x, y in run.batches(loader):
                ...; run.backward(loss); opt.step(); opt.zero_grad(); run.step(loss=loss)
            run.log(val_acc=evaluate(model))
"""

from __future__ import annotations

__all__ = [
    "Component",
    "ConfigError",
    "Event",
    "ExitCode",
    "PrudentError",
    "Run",
    "StopRun",
    "__version__",
    "init",
    "tune",
]

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from prudent.kernel.errors import ConfigError, ExitCode, PrudentError, StopRun
from prudent.kernel.events import Component, Event

if TYPE_CHECKING:
    from prudent.kernel.run import Run
    from prudent.tune.api import tune
    from prudent.wiring.session import init


def __getattr__(name: str) -> Any:
    """``Run``, ``init`` and ``tune`` are imported on first use: importing the kernel
    (``prudent.kernel.run``) must not pull in every plug-in through this package."""
    if name == "Run":
        from prudent.kernel.run import Run

        return Run
    if name == "init":
        from prudent.wiring.session import init

        return init
    if name == "tune":
        import importlib

        # the function shadows the subpackage's name once the subpackage is imported
        return importlib.import_module("prudent.tune.api").tune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
