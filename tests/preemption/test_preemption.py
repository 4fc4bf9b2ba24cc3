from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

import prudent
from prudent.preemption import PreemptionSettings, PreemptionWatcher, detect_cloud
from prudent.testing import local_http_server
from prudent.wiring.config import ProjectSettings

AZURE_EVENTS = {"Events": [{"EventType": "Freeze"},
                           {"EventType": "Preempt", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT"}]}


class Metadata(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/computeMetadata/v1/instance/preempted" and \
                self.headers.get("Metadata-Flavor") == "Google":
            return self._reply("TRUE")
        if self.path.startswith("/metadata/scheduledevents") and self.headers.get("Metadata") == "true":
            return self._reply(json.dumps(AZURE_EVENTS))
        self.send_response(404)
        self.end_headers()

    def _reply(self, body: str) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_url() -> Iterator[str]:
    with local_http_server(Metadata) as url:
        yield url


@pytest.mark.parametrize(("cloud", "expected"), [("gcp", "GCP interruption notice: instance preempted"),
                                                 ("azure", "AZURE interruption notice: Preempt")])
def test_notice_requests_a_preempted_stop_with_a_deadline(
        settings: ProjectSettings, metadata_url: str, cloud: str, expected: str) -> None:
    watcher = PreemptionWatcher(PreemptionSettings(watch="on", metadata_url=metadata_url,
                                                   poll_interval_s=0.05), [cloud])
    run = prudent.init(name="spot", settings=settings, exit_on_stop=False, components=[watcher])
    with run:
        deadline = time.monotonic() + 10
        while run.context.stop_requested is None and time.monotonic() < deadline:
            time.sleep(0.01)
        run.step(loss=1.0)
    assert run.stop_reason == "preempted" and watcher.notice is not None
    assert watcher.notice.startswith(expected)
    assert run.context.stop_deadline is not None and run.context.stop_deadline > time.time()


def test_unreachable_metadata_service_is_quiet(settings: ProjectSettings) -> None:
    watcher = PreemptionWatcher(PreemptionSettings(watch="on", metadata_url="http://127.0.0.1:9",
                                                   poll_interval_s=0.05, timeout_s=0.2), ["aws"])
    run = prudent.init(name="calm", settings=settings, exit_on_stop=False, components=[watcher])
    with run:
        time.sleep(0.3)
        run.step(loss=1.0)
    assert run.status == "completed"


def test_cloud_detection_reads_dmi_without_network(tmp_path: Path) -> None:
    vendor = tmp_path / "sys_vendor"
    vendor.write_text("Amazon EC2\n")
    assert detect_cloud((str(vendor),)) == "aws"
    vendor.write_text("Google\n")
    assert detect_cloud((str(vendor),)) == "gcp"
    assert detect_cloud((str(tmp_path / "missing"),)) is None


def test_watch_off_or_no_cloud_builds_nothing() -> None:
    assert PreemptionWatcher.build(PreemptionSettings(watch="off")) is None
    watcher = PreemptionWatcher.build(PreemptionSettings(watch=True))  # YAML's bare `on`
    assert watcher is not None and watcher.clouds in (["aws", "gcp", "azure"], ["aws"], ["gcp"], ["azure"])
