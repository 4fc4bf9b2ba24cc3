"""DebugMode: ``prudent run --debug`` / ``PRUDENT_DEBUG=1`` / ``debug: {enabled: true}``.

- every event is logged to stderr with what it carries (batch shapes, loss, metrics);
- ``torch.autograd.set_detect_anomaly(True)``: a backward that produces NaN raises at once,
  with the forward operation that caused it (then the failure capture writes a bundle);
- ``torch.use_deterministic_algorithms(True, warn_only=True)`` (and ``CUBLAS_WORKSPACE_CONFIG``
  on CUDA), so a rerun takes the same path;
- every monitoring rule that fires also captures (see :func:`capture_on_every_rule`).

Both torch switches are put back as they were when the run ends. It is slow: for finding a bug.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, TextIO

import torch

from prudent.debug.probe import describe_batch
from prudent.kernel.events import Component

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason
    from prudent.monitor.settings import MonitorSettings

__all__ = ["CUBLAS_WORKSPACE", "DebugMode", "capture_on_every_rule"]

CUBLAS_WORKSPACE = ":4096:8"  # what deterministic cuBLAS needs (set before CUDA starts)


def capture_on_every_rule(monitor: MonitorSettings, debug: bool) -> MonitorSettings:
    """In debug mode, every rule's actions end with ``capture``."""
    if not debug:
        return monitor
    from prudent.monitor.settings import MonitorSettings

    rules = {}
    for name, rule in monitor.rule_settings().items():
        actions = [*rule.action, *(["capture"] if "capture" not in rule.action else [])]
        rules[name] = {**rule.model_dump(), "action": actions}
    return MonitorSettings.model_validate({**monitor.model_dump(), "rules": rules})


class DebugMode(Component):
    name = "debug"

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._previous: tuple[bool, bool, bool] | None = None
        self._started = time.monotonic()

    def on_start(self, run: RunContext) -> None:
        self._previous = (torch.is_anomaly_enabled(), torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that anomaly mode is slow: we know
            torch.autograd.set_detect_anomaly(True)
        torch.use_deterministic_algorithms(True, warn_only=True)
        if torch.cuda.is_available() and not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        self._log(run, "start", "debug mode: anomaly detection on, deterministic algorithms on "
                  "(warn only), a capture on every rule firing, every event logged")

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        described = ", ".join(f"{k}={type(v).__name__}" for k, v in objects.items())
        self._log(run, "attach", described)

    def on_batch_loaded(self, run: RunContext, batch: Any, wait_s: float) -> None:
        self._log(run, "batch_loaded", f"epoch {run.state.epoch + 1} batch "
                  f"{run.state.batches_in_epoch}: {describe_batch(batch)}; waited "
                  f"{wait_s * 1000:.1f} ms")

    def on_after_backward(self, run: RunContext, loss: Any) -> None:
        self._log(run, "after_backward", f"loss {_value(loss)}")

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        self._log(run, "step_end", " ".join(f"{k}={_value(v)}" for k, v in metrics.items()))

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        self._log(run, "log", " ".join(f"{k}={v:.6g}" for k, v in metrics.items()))

    def on_epoch_end(self, run: RunContext, epoch: int) -> None:
        self._log(run, "epoch_end", f"epoch {epoch + 1} done")

    def on_checkpoint_saved(self, run: RunContext, path: str) -> None:
        self._log(run, "checkpoint_saved", path)

    def on_stop_requested(self, run: RunContext, reason: StopReason) -> None:
        self._log(run, "stop_requested", f"{reason}: {reason.message}")

    def on_capture_requested(self, run: RunContext, reason: str, message: str,
                             error: BaseException | None) -> None:
        self._log(run, "capture_requested", f"{reason}: {message}")

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        self._log(run, "end", f"{status}" + (f" ({stop_reason})" if stop_reason else ""))
        if self._previous is not None:
            anomaly, deterministic, warn_only = self._previous
            torch.autograd.set_detect_anomaly(anomaly)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
            self._previous = None

    def _log(self, run: RunContext, event: str, text: str) -> None:
        elapsed = time.monotonic() - self._started
        print(f"prudent debug | {elapsed:8.3f}s | step {run.state.step} | {event}: {text}",
              file=self.stream or sys.stderr, flush=True)


def _value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{float(value.detach().float().mean()):.6g}" if value.numel() else "[]"
    return f"{value:.6g}" if isinstance(value, float) else str(value)
