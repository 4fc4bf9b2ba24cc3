"""PreemptionWatcher: polls the cloud's interruption notice so the run stops before the kill.

A spot/preemptible machine is told shortly before it goes: AWS 2 minutes ahead (the EC2
``spot/instance-action`` metadata, polled every 5 s as AWS advises, IMDSv2 token first), GCP
and Azure only 30 s (GCE ``instance/preempted``, Azure Scheduled Events ``Preempt``). On a
notice the watcher asks the run to stop with reason ``preempted`` and tells it the deadline,
so the checkpointer can say whether an emergency save fits. Off unless a cloud is detected
(from DMI, without any network call) or ``preemption.watch: on``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from prudent.kernel.events import Component, EventKind
from prudent.kernel.stop import StopKind, StopReason
from prudent.preemption.cloud import detect_cloud
from prudent.preemption.settings import PreemptionSettings

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["PreemptionWatcher", "detect_cloud"]

GCP_NOTICE_S = 30.0
class PreemptionWatcher(Component):
    name = "preemption"

    def __init__(self, settings: PreemptionSettings, clouds: list[str]) -> None:
        self.settings = settings
        self.clouds = clouds
        self.notice: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def build(cls, settings: PreemptionSettings) -> PreemptionWatcher | None:
        detected = detect_cloud()
        if settings.watch == "off" or (settings.watch == "auto" and detected is None):
            return None
        cloud = settings.cloud if settings.cloud != "auto" else detected
        return cls(settings, [cloud] if cloud else ["aws", "gcp", "azure"])

    def on_start(self, run: RunContext) -> None:
        self._thread = threading.Thread(target=self._poll, args=(run,), daemon=True,
                                        name="prudent-preemption-watcher")
        self._thread.start()

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.timeout_s * 3 + 1)

    def _poll(self, run: RunContext) -> None:
        while not self._stop.is_set():
            for cloud in self.clouds:
                found = self._check(cloud)
                if found is not None:
                    self._announce(run, cloud, *found)
                    return
            self._stop.wait(self.settings.poll_interval_s)

    def _check(self, cloud: str) -> tuple[float, str] | None:
        try:
            return {"aws": self._aws, "gcp": self._gcp, "azure": self._azure}[cloud]()
        except (OSError, ValueError, KeyError):
            return None  # no metadata service, no notice, or a malformed answer: keep polling

    def _announce(self, run: RunContext, cloud: str, deadline: float, what: str) -> None:
        left = deadline - time.time()
        self.notice = f"{cloud.upper()} interruption notice: {what}, {left:.0f} s left"
        run.stop_deadline = deadline
        run.record_event(EventKind.PREEMPTION, "notice", self.notice, cloud=cloud, seconds_left=left)
        run.request_stop(StopReason(StopKind.PREEMPTED, None, self.notice))

    def _get(self, path: str, headers: dict[str, str], method: str = "GET") -> str:
        request = urllib.request.Request(self.settings.metadata_url.rstrip("/") + path,
                                         headers=headers, method=method)
        with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:  # noqa: S310
            return str(response.read().decode())

    def _aws(self) -> tuple[float, str] | None:
        token = self._get("/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"},
                          method="PUT")
        try:
            body = self._get("/latest/meta-data/spot/instance-action",
                             {"X-aws-ec2-metadata-token": token})
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        notice = json.loads(body)
        when = datetime.fromisoformat(notice["time"].replace("Z", "+00:00")).timestamp()
        return when, f"spot {notice['action']} at {notice['time']}"

    def _gcp(self) -> tuple[float, str] | None:
        body = self._get("/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"})
        if body.strip().upper() != "TRUE":
            return None
        return time.time() + GCP_NOTICE_S, "instance preempted"

    def _azure(self) -> tuple[float, str] | None:
        body = self._get("/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
        for event in json.loads(body).get("Events", []):
            if event.get("EventType") == "Preempt":
                not_before = event.get("NotBefore")
                when = (parsedate_to_datetime(not_before).timestamp() if not_before
                        else time.time() + GCP_NOTICE_S)
                return when, f"Preempt scheduled not before {not_before}"
        return None
