"""Instance detection from a (local, fake) cloud metadata service."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

import prudent
from prudent.cost import CostMeter, CostSettings, load_catalog
from prudent.cost.detect import with_detected
from prudent.preemption import PreemptionSettings
from prudent.store.database import Store
from prudent.testing import FakeClock, local_http_server, make_settings

ANSWERS = {
    "aws": {"/latest/meta-data/instance-type": "g5.xlarge",
            "/latest/meta-data/instance-life-cycle": "spot"},
    "gcp": {"/computeMetadata/v1/instance/machine-type": "projects/1/machineTypes/a2-highgpu-1g",
            "/computeMetadata/v1/instance/scheduling/provisioning-model": "STANDARD"},
    "azure": {"/metadata/instance/compute?api-version=2021-02-01":
              json.dumps({"vmSize": "Standard_NC24ads_A100_v4", "priority": "Spot"})},
}


def _handler(cloud: str) -> type[BaseHTTPRequestHandler]:
    class Metadata(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self._answer("token" if cloud == "aws" and self.path == "/latest/api/token" else None)

        def do_GET(self) -> None:
            self._answer(ANSWERS[cloud].get(self.path))

        def _answer(self, body: str | None) -> None:
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write((body or "").encode())

        def log_message(self, *args: object) -> None:
            pass

    return Metadata


@pytest.mark.parametrize(("cloud", "ref", "spot"), [("aws", "aws:g5.xlarge", True),
                                                    ("gcp", "gcp:a2-highgpu-1g", False),
                                                    ("azure", "azure:Standard_NC24ads_A100_v4", True)])
def test_detect_on_reads_instance_and_spot_from_each_cloud(cloud: str, ref: str, spot: bool) -> None:
    with local_http_server(_handler(cloud)) as url:
        cost, note = with_detected(CostSettings(detect="on"),
                                   PreemptionSettings(metadata_url=url, timeout_s=0.5),
                                   load_catalog())
    assert (cost.instance, cost.spot) == (ref, spot) and note and ref in note


def test_detection_is_off_off_cloud_and_never_overrides_what_the_user_said(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("prudent.cost.detect.detect_cloud", lambda: None)  # DMI is the host's
    unreachable = PreemptionSettings(metadata_url="http://127.0.0.1:9", timeout_s=0.2)
    assert with_detected(CostSettings(), unreachable, load_catalog()) == (CostSettings(), None)
    given = CostSettings(detect="on", instance="gcp:g2-standard-4")
    assert with_detected(given, unreachable, load_catalog()) == (given, None)
    cost, note = with_detected(CostSettings(detect="on"), unreachable, load_catalog())
    assert cost.instance is None and "metered at $0" in (note or "")


def test_a_run_on_a_detected_instance_is_metered_at_its_price(home: Path) -> None:
    clock = FakeClock()
    with local_http_server(_handler("aws")) as url:
        settings = make_settings(home, cost={"detect": "on"},
                                 preemption={"metadata_url": url, "watch": "off"})
        meter = CostMeter(settings.cost, quiet=True, clock=clock)
        run = prudent.init(name="detected", settings=settings, components=[meter],
                           exit_on_stop=False)
        with run:
            clock.advance(3600)
    store = Store.open(settings.store)
    assert store.get_run(run.id)["cost_usd"] == pytest.approx(0.4328)  # g5.xlarge spot, 1 h
    assert any(e["name"] == "detect" for e in store.events(run.id))
    store.close()
