from __future__ import annotations

import re
from datetime import date
from importlib import resources
from pathlib import Path

import pytest

from prudent.cost.catalog import COLUMNS, load_catalog, matches, parse_rows, write_rows
from prudent.kernel.errors import ConfigError


def _bundled_text() -> str:
    return resources.files("prudent.cost").joinpath("prices.csv").read_text()


def test_bundled_catalog_covers_six_clouds() -> None:
    rows = load_catalog().rows()
    assert len(rows) >= 60
    assert {r.cloud for r in rows} == {"aws", "gcp", "azure", "lambda", "nebius", "runpod"}
    assert all(len([r for r in rows if r.cloud == c]) >= 8 for c in ("aws", "gcp", "azure"))
    assert len([r for r in rows if r.cloud in ("lambda", "nebius", "runpod")]) >= 5


def test_every_bundled_row_is_well_formed_with_its_source_and_date() -> None:
    lines = [line for line in _bundled_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == ",".join(COLUMNS)
    for row in load_catalog().rows():
        assert re.fullmatch(r"[a-z]+", row.cloud) and row.instance and row.region and row.gpu
        assert 1 <= row.num_gpus <= 16 and row.vcpus >= 1 and row.memory_gib >= 1
        assert 0 < row.on_demand_usd < 200
        assert date.fromisoformat(row.prices_as_of) <= date.today()
        assert row.source and row.source != "bundled"
        if row.spot_usd is None:  # said, never invented
            assert row.spot_note and row.hourly_usd(spot=True) == row.on_demand_usd
        else:
            assert 0 < row.spot_usd < row.on_demand_usd and row.spot_note is None
            assert row.hourly_usd(spot=True) == row.spot_usd


def test_bundled_prices_are_skypilots_current_ones() -> None:
    catalog = load_catalog()
    p5 = catalog.lookup("aws:p5.48xlarge")
    assert (p5.on_demand_usd, p5.spot_usd, p5.prices_as_of) == (55.04, 16.9508, "2026-12-03")
    assert p5.source == "skypilot-catalog@2c3d7ea:catalogs/v9/aws/vms.csv"
    assert catalog.lookup("aws:p5en.48xlarge").gpu == "H200"
    assert catalog.lookup("aws:p6-b200.48xlarge").on_demand_usd == 113.9328
    assert catalog.lookup("aws:p5.4xlarge").num_gpus == 1
    assert catalog.lookup("nebius:gpu-h100-sxm_1gpu-16vcpu-200gb").on_demand_usd == 2.95
    assert catalog.lookup("runpod:1x_A100-80GB_SECURE").spot_usd == 1.19
    lambda_row = catalog.lookup("lambda:gpu_8x_a100")
    assert lambda_row.spot_usd is None and "no spot" in (lambda_row.spot_note or "")
    gcp = catalog.lookup("gcp:a3-highgpu-8g")  # not refreshed: keeps its own date
    assert gcp.prices_as_of == "2025-01-15" and "2025-01-15" in gcp.source


def test_bundled_prices_say_they_are_dated_list_prices_to_override() -> None:
    header = [line for line in _bundled_text().splitlines() if line.startswith("#")]
    text = " ".join(header).lower()
    assert "list prices" in text and "as of" in text and "catalog_file" in text
    assert "prudent catalog import" in text


def test_lookup_accepts_cloud_prefix_any_case_and_unique_bare_names() -> None:
    catalog = load_catalog()
    assert catalog.lookup("aws:p4d.24xlarge").num_gpus == 8
    assert catalog.lookup("AZURE:standard_nc24ads_a100_v4").gpu == "A100-80GB"
    assert catalog.lookup("g5.xlarge").ref == "aws:g5.xlarge"


def test_unknown_instance_names_close_matches_and_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        load_catalog().lookup("aws:p4d.24xlarg")
    message = str(info.value)
    assert message.startswith("unknown instance type 'aws:p4d.24xlarg': did you mean aws:p4d.24xlarge")
    assert "prudent catalog" in message and "cost.catalog_file" in message


def test_user_file_adds_and_overrides_rows(tmp_path: Path) -> None:
    user = tmp_path / "mine.csv"
    user.write_text("# negotiated\n" + ",".join(COLUMNS) + "\n"
                    "aws,g5.xlarge,us-east-1,A10G,1,4,16,0.70,,2026-11-01\n"
                    "onprem,dgx1,basement,V100,8,80,512,5,,2026-11-01\n")
    catalog = load_catalog(str(user))
    assert catalog.lookup("aws:g5.xlarge").on_demand_usd == 0.70
    assert catalog.lookup("aws:g5.xlarge").source == str(user)
    assert catalog.lookup("aws:g5.xlarge").hourly_usd(spot=True) == 0.70  # no spot price: on demand
    assert catalog.lookup("onprem:dgx1").source == str(user)
    assert len(catalog) == len(load_catalog()) + 1


@pytest.mark.parametrize(("body", "expected"), [
    ("aws,x,r,T4,one,4,16,1,,2026-01-01", "line 2: num_gpus='one' is not a number"),
    ("aws,x,r,T4,1,4,16,-1,,2026-01-01", "line 2: on_demand_usd='-1' is negative"),
    (",x,r,T4,1,4,16,1,,2026-01-01", "line 2: cloud and instance must not be empty"),
])
def test_bad_user_rows_name_the_line_and_the_problem(body: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_rows(",".join(COLUMNS) + "\n" + body, "mine.csv")


def test_missing_user_file_and_missing_columns_are_clear() -> None:
    with pytest.raises(ConfigError, match="cannot read catalog file 'nope.csv'"):
        load_catalog("nope.csv")
    with pytest.raises(ConfigError, match="missing column.*on_demand_usd"):
        parse_rows("cloud,instance\naws,x\n", "mine.csv")


def test_globs_match_cloud_and_instance() -> None:
    assert matches("aws:g5.xlarge", "aws:g5.*") and matches("aws:g5.xlarge", "g5.*")
    assert not matches("aws:g5.xlarge", "gcp:*") and not matches("aws:p4d.24xlarge", "aws:g5.*")


def test_a_source_column_is_kept_and_write_rows_reads_back(tmp_path: Path) -> None:
    rows = parse_rows(",".join(COLUMNS) + "\naws,x,r,T4,1,4,16,1.5,,2026-01-01,my deal\n", "m.csv",
                      source="m.csv")
    assert rows[0].source == "my deal"
    target = tmp_path / "out.csv"
    write_rows([*rows, load_catalog().lookup("aws:p5.48xlarge")], target, "two rows")
    again = parse_rows(target.read_text(), str(target))
    assert again == [rows[0], load_catalog().lookup("aws:p5.48xlarge")]
    assert target.read_text().startswith("# two rows\n") and not list(tmp_path.glob(".*tmp"))


def test_globs_match_the_new_clouds() -> None:
    catalog = load_catalog()
    assert len(catalog.matching("runpod:*A100-80GB*")) == 8
    assert {r.cloud for r in catalog.matching("nebius:gpu-h1*")} == {"nebius"}
    assert matches("lambda:gpu_1x_a6000", "lambda:gpu_*")
