"""Where am I running, asked of the cloud's metadata service when the user did not say.

Off unless asked (``cost.detect: on``) or already on a cloud (``auto``: DMI names AWS, GCP or
Azure, read without any network call). Requests have a short timeout and the base URL is
``preemption.metadata_url`` (tests point it at a local server). A failure is not an error:
the run is then metered at $0, and an event says why.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

from prudent.cost.catalog import Catalog
from prudent.cost.settings import CostSettings
from prudent.kernel.errors import ConfigError
from prudent.preemption.cloud import detect_cloud
from prudent.preemption.settings import PreemptionSettings

__all__ = ["detect_instance", "with_detected"]

Get = Callable[[str, dict[str, str]], str]


def detect_instance(base_url: str, timeout_s: float, cloud: str | None = None) -> tuple[str, bool] | None:
    """``("aws:g5.xlarge", spot)`` from the metadata service, or None if nothing answers."""
    def get(path: str, headers: dict[str, str]) -> str:
        request = urllib.request.Request(base_url.rstrip("/") + path, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return str(response.read().decode()).strip()

    clouds = [cloud] if cloud else [c for c in (detect_cloud(),) if c] or ["aws", "gcp", "azure"]
    for name in clouds:
        try:
            return _ASK[name](get, base_url, timeout_s)
        except (OSError, ValueError, KeyError):
            continue
    return None


def _aws(get: Get, base_url: str, timeout_s: float) -> tuple[str, bool]:
    token_request = urllib.request.Request(
        base_url.rstrip("/") + "/latest/api/token", method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    with urllib.request.urlopen(token_request, timeout=timeout_s) as response:
        token = response.read().decode()
    headers = {"X-aws-ec2-metadata-token": token}
    kind = get("/latest/meta-data/instance-type", headers)
    lifecycle = get("/latest/meta-data/instance-life-cycle", headers)
    return f"aws:{kind}", lifecycle == "spot"


def _gcp(get: Get, base_url: str, timeout_s: float) -> tuple[str, bool]:
    headers = {"Metadata-Flavor": "Google"}
    machine = get("/computeMetadata/v1/instance/machine-type", headers).rsplit("/", 1)[-1]
    model = get("/computeMetadata/v1/instance/scheduling/provisioning-model", headers)
    return f"gcp:{machine}", model.upper() == "SPOT"


def _azure(get: Get, base_url: str, timeout_s: float) -> tuple[str, bool]:
    compute = json.loads(get("/metadata/instance/compute?api-version=2021-02-01",
                             {"Metadata": "true"}))
    return f"azure:{compute['vmSize']}", str(compute.get("priority", "")).lower() == "spot"


_ASK = {"aws": _aws, "gcp": _gcp, "azure": _azure}


def with_detected(cost: CostSettings, preemption: PreemptionSettings,
                  catalog: Catalog) -> tuple[CostSettings, str | None]:
    """``cost`` with the detected instance filled in when detection applies; and what happened."""
    if cost.instance or cost.hourly_usd is not None or cost.detect == "off":
        return cost, None
    on_cloud = detect_cloud()
    if cost.detect == "auto" and on_cloud is None:
        return cost, None
    found = detect_instance(preemption.metadata_url, preemption.timeout_s, on_cloud)
    if found is None:
        return cost, (f"no cloud metadata service answered at {preemption.metadata_url}: "
                      "metered at $0; set cost.instance (--instance)")
    ref, spot = found
    try:
        row = catalog.lookup(ref)
    except ConfigError as exc:
        return cost, f"detected {ref}, which the catalog lacks ({exc}); metered at $0"
    note = f"detected {ref}{' on spot' if spot else ''} from the cloud metadata service"
    if spot and row.spot_note:
        spot, note = False, f"{note}; {row.spot_note}: metered on demand"
    return cost.model_copy(update={"instance": ref, "spot": spot or cost.spot}), note
