from __future__ import annotations

import re
from datetime import date
from importlib import resources
from pathlib import Path

import pytest

from prudent.cost.catalog import COLUMNS, load_catalog, matches, parse_rows
from prudent.errors import ConfigError


def _bundled_text() -> str:
    return resources.files("prudent.cost").joinpath("prices.csv").read_text()


def test_bundled_catalog_has_30_gpu_types_across_the_three_clouds() -> None:
    rows = load_catalog().rows()
    assert len(rows) >= 30
    assert {r.cloud for r in rows} == {"aws", "gcp", "azure"}
    assert all(len([r for r in rows if r.cloud == c]) >= 8 for c in ("aws", "gcp", "azure"))


def test_every_bundled_row_is_well_formed() -> None:
    lines = [line for line in _bundled_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == ",".join(COLUMNS)
    for row in load_catalog().rows():
        assert re.fullmatch(r"[a-z]+", row.cloud) and row.instance and row.region and row.gpu
        assert 1 <= row.num_gpus <= 16 and row.vcpus >= 1 and row.memory_gib >= 1
        assert 0 < row.on_demand_usd < 200
        assert row.spot_usd is not None and 0 < row.spot_usd < row.on_demand_usd
        assert date.fromisoformat(row.prices_as_of) <= date.today()
        assert row.hourly_usd(spot=True) == row.spot_usd


def test_bundled_prices_say_they_are_dated_list_prices_to_override() -> None:
    header = [line for line in _bundled_text().splitlines() if line.startswith("#")]
    text = " ".join(header).lower()
    assert "list prices" in text and "as of 20" in text and "catalog_file" in text


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
