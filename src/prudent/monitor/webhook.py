"""WebhookSender: POST alerts as JSON from a background thread, never blocking training.

The URL often is the secret (Slack, Teams and Discord webhooks carry the token in the path),
so it is never printed, logged, stored or put in an error message: a failure names only the
scheme and host.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = ["WebhookSender"]


class WebhookSender:
    """Sends payloads in order on one daemon thread, started at the first ``send``."""

    def __init__(self, url: str, timeout_s: float = 10.0,
                 on_error: Callable[[str], None] | None = None) -> None:
        self._url = url
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.num_sent = 0
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"WebhookSender({self.where!r})"

    @property
    def where(self) -> str:
        """Scheme and host of the URL: all of it that is safe to show."""
        parts = urllib.parse.urlsplit(self._url)
        return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else "")

    def send(self, payload: dict[str, Any]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="prudent-webhook", daemon=True)
            self._thread.start()
        self._queue.put(payload)

    def close(self, timeout_s: float | None = None) -> None:
        """Deliver what is queued (waiting at most ``timeout_s``), then stop the thread."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(self.timeout_s + 1 if timeout_s is None else timeout_s)
        self._thread = None

    def _loop(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is None:
                return
            self._post(payload)

    def _post(self, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        request = urllib.request.Request(self._url, data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "User-Agent": "prudent"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
            self.num_sent += 1
        except Exception as exc:  # noqa: BLE001 - a failed alert must never stop training
            self._report(exc)

    def _report(self, exc: BaseException) -> None:
        if isinstance(exc, urllib.error.HTTPError):
            why = f"HTTP {exc.code}"
        elif isinstance(exc, urllib.error.URLError):
            why = type(exc.reason).__name__ if isinstance(exc.reason, BaseException) else "URLError"
        else:
            why = type(exc).__name__
        if self.on_error is not None:
            self.on_error(f"alert webhook POST to {self.where} failed: {why}")
