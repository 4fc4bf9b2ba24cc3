"""Alerts POSTed to a real HTTP server on 127.0.0.1; the secret in the URL never leaks."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import prudent
from prudent.monitor import Monitor
from prudent.monitor.webhook import WebhookSender
from prudent.store.database import Store
from prudent.testing import make_settings, tiny_loader, tiny_model

SECRET_PATH = "/services/T000/B000/s3cr3t-t0ken"


class Receiver:
    """A local webhook endpoint that records what it is sent and answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        received = self.received = []  # type: list[dict[str, Any]]

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append({"path": self.path, "type": self.headers["Content-Type"],
                                 "json": json.loads(body)})
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{SECRET_PATH}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def failing_receiver() -> Iterator[Receiver]:
    server = Receiver(status=500)
    yield server
    server.close()


def poisoned_run(home: Path, url: str, console: io.StringIO) -> prudent.Run:
    settings = make_settings(home, monitor={"actions": {"alert": {"webhook_url": url}}})
    run = prudent.init(name="hook", settings=settings, exit_on_stop=False,
                       components=[Monitor(settings.monitor, stream=console)])
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(3):
            for x, y in run.batches(tiny_loader()):
                if run.state.step == 12:
                    x = x * float("nan")
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
    return run


def everything_recorded(home: Path, run: prudent.Run) -> str:
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    try:
        return json.dumps([store.get_run(run.id), store.events(run.id)], default=str)
    finally:
        store.close()


def test_a_firing_is_posted_as_json_and_the_secret_is_never_recorded(
        home: Path, receiver: Receiver) -> None:
    console = io.StringIO()
    run = poisoned_run(home, receiver.url, console)
    assert run.stop_reason == "rule:non_finite"
    (post,) = receiver.received
    assert post["path"] == SECRET_PATH and post["type"] == "application/json"
    body = post["json"]
    assert {k: body[k] for k in ("run_id", "rule", "step", "detected_at", "value", "action")} == {
        "run_id": run.id, "rule": "non_finite", "step": 13, "detected_at": 13, "value": "nan",
        "action": ["stop"]}
    assert body["message"].startswith("loss is NaN at step 13")
    assert "s3cr3t" not in everything_recorded(home, run) + console.getvalue()


def test_a_failed_post_is_an_event_naming_only_the_host(home: Path,
                                                        failing_receiver: Receiver) -> None:
    run = poisoned_run(home, failing_receiver.url, io.StringIO())
    assert run.stop_reason == "rule:non_finite" and len(failing_receiver.received) == 1
    recorded = everything_recorded(home, run)
    port = failing_receiver.server.server_address[1]
    assert f"alert webhook POST to http://127.0.0.1:{port} failed: HTTP 500" in recorded
    assert "s3cr3t" not in recorded


def test_an_unreachable_endpoint_is_reported_without_the_url() -> None:
    errors: list[str] = []
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as closed:
        port = closed.server_address[1]  # bound, then closed: nobody listens there
    sender = WebhookSender(f"http://127.0.0.1:{port}{SECRET_PATH}", timeout_s=5,
                           on_error=errors.append)
    sender.send({"rule": "x"})
    sender.close()
    assert errors == [f"alert webhook POST to http://127.0.0.1:{port} failed: ConnectionRefusedError"]
    assert "s3cr3t" not in repr(sender)
