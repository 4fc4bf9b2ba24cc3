"""Current prices end to end: the new clouds metered by real runs, SkyPilot's local catalog
picked up and named, spot refused where there is none, a stale price said once."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Project, script

FIXTURES = Path(__file__).parents[1] / "cost" / "skypilot"
H100 = "nebius:gpu-h100-sxm_1gpu-16vcpu-200gb"
SHORT = ["--set", "epochs=1", "--set", "batches=4", "--set", "sleep_s=0"]


def _home(project: Project) -> Path:
    """A HOME of the test's own (no ~/.sky unless the test puts one there)."""
    home = project.path / "home"
    home.mkdir(exist_ok=True)
    project.env["HOME"] = str(home)
    return home


def _price_event(project: Project, run_id: str) -> dict[str, Any]:
    (price,) = [e["payload"] for e in project.show(run_id)["events"]
                if (e["kind"], e["name"]) == ("cost", "price")]
    return price


def _train(project: Project, run_id: str, *flags: str) -> Any:
    return project.prudent("run", "--run-id", run_id, *flags, *SHORT, "--", sys.executable,
                           script("cost_train.py"))


def test_a_run_on_nebius_is_metered_at_the_catalog_price(project: Project) -> None:
    _home(project)
    result = _train(project, "n1", "--instance", H100)
    assert result.returncode == 0, result.stderr
    assert "DONE 4" in result.stdout and "warning" not in result.stderr
    shown = project.show("n1")
    assert shown["cost"]["instance"] == H100 and shown["cost"]["hourly_usd"] == 2.95
    price = _price_event(project, "n1")
    assert price["source"] == "skypilot-catalog@22fd1fe:catalogs/v7/nebius/vms.csv"
    assert (price["prices_as_of"], price["stale"]) == ("2026-12-03", None)


def test_skypilots_local_catalog_newer_than_the_bundled_one_prices_the_run(
        project: Project) -> None:
    sky = _home(project) / ".sky" / "catalogs" / "v7" / "nebius" / "vms.csv"
    sky.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "v7" / "nebius" / "vms.csv", sky)
    sky.write_text(sky.read_text().replace(",2.95,1.25,", ",3.05,1.25,"))  # zone b
    now = time.time()
    os.utime(sky, (now, now))
    result = _train(project, "n2", "--instance", H100)
    assert result.returncode == 0, result.stderr
    price = _price_event(project, "n2")
    assert price["source"] == f"skypilot:{sky}" and price["hourly_usd"] == 3.05
    listed = json.loads(project.prudent("catalog", "--cloud", "nebius", "--json").stdout)
    assert {r["source"] for r in listed if r["ref"] == H100} == {f"skypilot:{sky}"}


def test_spot_on_a_cloud_without_spot_is_one_line_exit_2(project: Project) -> None:
    _home(project)
    result = _train(project, "l1", "--instance", "lambda:gpu_1x_a6000", "--spot")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == ("prudent: error: --spot on lambda:gpu_1x_a6000: Lambda Cloud sells no spot "
                    "(interruptible) instances; run it on demand (drop --spot / cost.spot) or "
                    "pick a type with a spot price (`prudent catalog --cloud lambda`)")
    assert not (project.path / ".prudent").exists()


def test_a_stale_price_is_warned_once_when_the_run_starts(project: Project) -> None:
    _home(project)
    result = _train(project, "g1", "--instance", "gcp:g2-standard-4")
    assert result.returncode == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if "days old" in line]
    assert "warning: the price of gcp:g2-standard-4 is" in warning
    assert "as of 2025-01-15" in warning and "prudent catalog import" in warning
    assert "days old" in (_price_event(project, "g1")["stale"] or "")


def test_policy_check_and_import_on_the_new_clouds(project: Project) -> None:
    _home(project)
    (project.path / "policy.yaml").write_text("allowed_instances: ['runpod:*', 'nebius:*']\n")
    ok = project.prudent("policy", "check", "--policy", "policy.yaml", "--instance",
                         "runpod:2x_A100-80GB_SECURE", "--hours", "10", "--spot")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0] == ("projected cost $23.80: 10 h at $2.38/h "
                                         "(runpod:2x_A100-80GB_SECURE spot x 1 node)")
    refused = project.prudent("policy", "check", "--policy", "policy.yaml", "--instance",
                              "lambda:gpu_8x_a100", "--hours", "1")
    assert refused.returncode == 1 and "violates allowed_instances" in refused.stdout

    bad = project.path / "aws" / "vms.csv"
    bad.parent.mkdir()
    bad.write_text("InstanceType,Price\np5.48xlarge,55.04\n")
    result = project.prudent("catalog", "import", str(bad), "--to", "prices.csv")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"prudent: error: {bad} line 1: not a SkyPilot vms.csv")
    assert not (project.path / "prices.csv").exists()
