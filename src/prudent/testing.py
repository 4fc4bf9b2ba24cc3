"""Fakes and helpers for testing prudent and components built on it (CPU only, no network).

    from prudent.testing import make_settings, tiny_loader, tiny_model
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prudent.kernel.events import Component
from prudent.wiring.config import ProjectSettings

__all__ = ["FakeClock", "StopAtStep", "local_http_server", "make_settings", "tiny_loader",
           "tiny_model"]


def make_settings(home: str | Path, **sections: dict[str, Any]) -> ProjectSettings:
    """Settings with the store in ``home`` and the console off, plus any section overrides."""
    data: dict[str, Any] = {"store": {"home": str(home)}, "console": {"mode": "off"}}
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return ProjectSettings.model_validate(data)


def tiny_model(in_features: int = 8, hidden: int = 16, out_features: int = 2, seed: int = 0) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(in_features, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, out_features))


def tiny_loader(num_samples: int = 64, batch_size: int = 8, in_features: int = 8,
                num_classes: int = 2, seed: int = 0) -> Any:
    """A DataLoader over generated data: a learnable rule, no download."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, in_features, generator=generator)
    y = (x[:, 0] > 0).long() % num_classes
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


class FakeClock:
    """A clock tests advance by hand: ``clock()`` returns the time, ``clock.advance(s)``."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def local_http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) and yield its base URL; stopped on exit.

    For real HTTP peers in tests: a cloud metadata service, a webhook receiver.
    """
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="prudent-test-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class StopAtStep(Component):
    """Asks the run to stop once ``step`` steps are done, with ``reason`` (a stop_reason
    string): a preemption, a rule or a budget at a step the test chooses."""

    name = "stop_at_step"

    def __init__(self, step: int, reason: str = "preempted") -> None:
        self.step, self.reason = step, reason

    def on_step_end(self, ctx: Any, metrics: Any) -> None:
        if ctx.state.step == self.step:
            ctx.request_stop(self.reason, f"stopping at step {self.step}")
