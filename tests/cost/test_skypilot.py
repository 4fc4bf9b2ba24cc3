"""SkyPilot's vms.csv (schema v7 and v9) read as catalog rows: regions, zones, bad input, and
the local SkyPilot catalog picked up where it is newer than the bundled prices."""

from __future__ import annotations

import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from prudent.cost.catalog import from_skypilot as read_skypilot
from prudent.cost.catalog import load_catalog
from prudent.cost.settings import CostSettings
from prudent.cost.skypilot import local_catalogs
from prudent.kernel.errors import ConfigError

FIXTURES = Path(__file__).parent / "skypilot"
AWS_V9 = FIXTURES / "v9" / "aws" / "vms.csv"  # an extra column (Arch), 3 zones, a zone without spot
NEBIUS_V7 = FIXTURES / "v7" / "nebius" / "vms.csv"  # columns in another order, a type without spot


def _by_name(rows: list) -> dict:
    return {r.instance: r for r in rows}


def test_v9_spot_is_the_lowest_over_the_reference_regions_zones_extra_columns_ignored() -> None:
    rows = _by_name(read_skypilot(AWS_V9, as_of="2026-12-01"))
    p5 = rows["p5.48xlarge"]
    assert (p5.cloud, p5.region, p5.gpu, p5.num_gpus, p5.vcpus, p5.memory_gib) == (
        "aws", "us-east-1", "H100", 8, 192, 2048.0)
    assert (p5.on_demand_usd, p5.spot_usd) == (55.04, 16.9508)  # us-west-2's 20.1 is not read
    assert rows["p5.4xlarge"].spot_usd == 5.4046
    assert (p5.prices_as_of, p5.source) == ("2026-12-01", f"skypilot:{AWS_V9}")


def test_cpu_only_rows_and_fractions_of_a_gpu_are_left_out() -> None:
    assert set(_by_name(read_skypilot(AWS_V9))) == {"p5.48xlarge", "p5.4xlarge"}


def test_a_chosen_region_prices_every_type_there() -> None:
    rows = _by_name(read_skypilot(AWS_V9, region="us-west-2"))
    assert set(rows) == {"p5.48xlarge"} and rows["p5.48xlarge"].spot_usd == 20.1


def test_v7_default_region_is_the_reference_one_else_the_first_that_offers_the_type() -> None:
    rows = _by_name(read_skypilot(NEBIUS_V7))
    h100 = rows["gpu-h100-sxm_1gpu-16vcpu-200gb"]
    assert (h100.region, h100.on_demand_usd, h100.spot_usd) == ("eu-north1", 2.95, 1.25)
    assert rows["gpu-h200-sxm_8gpu-128vcpu-1600gb"].region == "us-central1"


def test_a_type_without_spot_price_says_so_instead_of_inventing_one() -> None:
    b200 = _by_name(read_skypilot(NEBIUS_V7))["gpu-b200-sxm_8gpu-160vcpu-1792gb"]
    assert b200.spot_usd is None
    assert b200.spot_note == "no spot price for nebius:gpu-b200-sxm_8gpu-160vcpu-1792gb in the catalog"


def test_rows_are_dated_by_the_files_modification_day(tmp_path: Path) -> None:
    path = tmp_path / "nebius" / "vms.csv"
    path.parent.mkdir()
    shutil.copy(NEBIUS_V7, path)
    os.utime(path, (1_780_000_000, 1_780_000_000))  # 2026-05-28
    assert {r.prices_as_of for r in read_skypilot(path)} == {"2026-05-28"}


def _bad(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "aws" / "vms.csv"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("InstanceType,Price,Region\np5.48xlarge,55.04,us-east-1\n",
     "line 1: not a SkyPilot vms.csv, missing column(s) AcceleratorName, AcceleratorCount"),
    (HEADER + "p5.48xlarge,H100,8,192,2048,55.04,1,us-east-1\np5.4xlarge,H100,1,16\n",
     "line 3: 8 columns in the header but not in this row"),
    (HEADER + "p5.48xlarge,H100,8,192,2048,cheap,1,us-east-1\n",
     "line 2: Price='cheap' is not a number"),
    (HEADER + "p5.48xlarge,H100,8,192,2048,55.04,,us-east-1\np5.4xlarge,H100,1,16,256,,2,us-east-1\n",
     "line 3: p5.4xlarge in us-east-1 has no Price"),
])
def test_a_malformed_file_names_the_file_the_line_and_the_fix(
        tmp_path: Path, text: str, expected: str) -> None:
    path = _bad(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        read_skypilot(path)
    message = str(info.value)
    assert message.startswith(f"{path} ") and expected in message
    assert "fix" in message


def test_an_unknown_region_lists_the_files_regions() -> None:
    with pytest.raises(ConfigError, match=re.escape(
            "unknown region 'eu-mars-1' for aws (the file has us-east-1, us-west-2); fix "
            "cost.regions.aws or --region")):
        read_skypilot(AWS_V9, region="eu-mars-1")


def test_gcp_files_are_refused_because_the_gpu_is_priced_apart(tmp_path: Path) -> None:
    path = tmp_path / "gcp" / "vms.csv"
    path.parent.mkdir()
    path.write_text(HEADER)
    with pytest.raises(ConfigError, match="prices the GPU apart from the VM"):
        read_skypilot(path)


def test_the_cloud_comes_from_the_folder_or_must_be_given(tmp_path: Path) -> None:
    path = tmp_path / "vms.csv"
    shutil.copy(AWS_V9, path)
    with pytest.raises(ConfigError, match="which cloud's prices are these"):
        read_skypilot(path)
    assert read_skypilot(path, cloud="aws")[0].cloud == "aws"


def test_catalog_file_may_be_a_skypilot_file_with_a_region_setting() -> None:
    catalog = load_catalog(CostSettings(catalog_file=str(AWS_V9), regions={"aws": "us-west-2"},
                                        skypilot_catalogs=False))
    assert catalog.lookup("aws:p5.48xlarge").spot_usd == 20.1
    assert catalog.lookup("aws:g5.xlarge").source.startswith("skypilot-catalog@")  # bundled


# SkyPilot's local catalog ------------------------------------------------------------------
def _sky_home(tmp_path: Path, mtime: float) -> Path:
    home = tmp_path / ".sky"
    for version, cloud, source in (("v7", "nebius", NEBIUS_V7), ("v6", "nebius", AWS_V9),
                                   ("v9", "aws", AWS_V9)):
        path = home / "catalogs" / version / cloud / "vms.csv"
        path.parent.mkdir(parents=True)
        shutil.copy(source, path)
        os.utime(path, (mtime, mtime))
    return home


def test_the_newest_schema_of_each_cloud_is_found(tmp_path: Path) -> None:
    home = _sky_home(tmp_path, 0)
    assert local_catalogs(home) == {"aws": home / "catalogs/v9/aws/vms.csv",
                                    "nebius": home / "catalogs/v7/nebius/vms.csv"}


def test_a_local_skypilot_catalog_newer_than_the_bundled_one_prices_the_run(
        tmp_path: Path) -> None:
    home = _sky_home(tmp_path, datetime.now(timezone.utc).timestamp())
    catalog = load_catalog(CostSettings(skypilot_home=str(home)))
    p5 = catalog.lookup("aws:p5.48xlarge")
    assert p5.source == f"skypilot:{home / 'catalogs/v9/aws/vms.csv'}" and p5.spot_usd == 16.9508
    assert catalog.lookup("nebius:gpu-h100-sxm_1gpu-16vcpu-200gb").spot_usd == 1.25
    assert catalog.lookup("aws:g5.xlarge").source.startswith("skypilot-catalog@")  # not in it


def test_the_home_is_found_through_the_home_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _sky_home(tmp_path, datetime.now(timezone.utc).timestamp())
    monkeypatch.setenv("HOME", str(home.parent))
    assert load_catalog().lookup("aws:p5.48xlarge").source.startswith(f"skypilot:{home}")


def test_an_older_local_catalog_or_the_setting_off_leaves_the_bundled_prices(
        tmp_path: Path) -> None:
    old = _sky_home(tmp_path, 1_735_689_600)  # 2025-01-01, older than the bundled AWS rows
    assert load_catalog(CostSettings(skypilot_home=str(old))).lookup(
        "aws:p5.48xlarge").source.startswith("skypilot-catalog@")
    os.utime(old / "catalogs/v9/aws/vms.csv")
    off = CostSettings(skypilot_home=str(old), skypilot_catalogs=False)
    assert load_catalog(off).lookup("aws:p5.48xlarge").source.startswith("skypilot-catalog@")


def test_a_broken_local_catalog_names_the_file_and_how_to_ignore_it(tmp_path: Path) -> None:
    home = _sky_home(tmp_path, datetime.now(timezone.utc).timestamp())
    (home / "catalogs/v9/aws/vms.csv").write_text(HEADER + "p5.48xlarge,H100,8\n")
    with pytest.raises(ConfigError, match="line 2: .*cost.skypilot_catalogs: false"):
        load_catalog(CostSettings(skypilot_home=str(home)))
