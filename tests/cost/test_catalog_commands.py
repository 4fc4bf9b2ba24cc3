"""``prudent catalog [--json]``, ``prudent catalog import`` and the staleness line of
``prudent policy check``, through the command line app (in process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prudent.cli import app
from prudent.cost.catalog import load_catalog
from prudent.kernel.errors import ConfigError

FIXTURES = Path(__file__).parent / "skypilot"


def _prudent(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


def test_catalog_json_has_current_prices_with_source_and_date(home: Path) -> None:
    result = _prudent("catalog", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["ref"]: r for r in json.loads(result.stdout)}
    assert rows["aws:p5.48xlarge"]["on_demand_usd"] == 55.04
    for ref in ("aws:p5en.48xlarge", "aws:p6-b200.48xlarge", "aws:p5.4xlarge"):
        assert rows[ref]["source"].startswith("skypilot-catalog@") and rows[ref]["prices_as_of"]
    new = [r for r in rows.values() if r["cloud"] in ("lambda", "runpod", "nebius")]
    assert len(new) >= 5 and all(r["source"] and r["prices_as_of"] for r in new)
    assert rows["lambda:gpu_1x_a6000"]["spot_usd"] is None
    assert "no spot" in rows["lambda:gpu_1x_a6000"]["spot_note"]


def test_catalog_lists_one_of_the_new_clouds(home: Path) -> None:
    result = _prudent("catalog", "--cloud", "nebius")
    assert result.exit_code == 0, result.output
    assert "nebius:gpu-h100-sxm_1gpu-16vcpu-200gb" in result.stdout and "aws:" not in result.stdout


def _copy(home: Path, version: str, cloud: str) -> Path:
    path = home.parent / "downloads" / cloud / "vms.csv"
    path.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / version / cloud / "vms.csv", path)
    return path


def test_import_writes_a_catalog_file_that_cost_catalog_file_uses(home: Path) -> None:
    source = _copy(home, "v9", "aws")
    result = _prudent("catalog", "import", str(source), "--region", "us-west-2",
                      "--as-of", "2026-12-02", "--to", "prices.csv")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"imported 1 aws instance types (us-west-2, as of 2026-12-02) from {source} into prices.csv",
        "to price runs with them, set cost.catalog_file: prices.csv in prudent.yaml"]
    row = load_catalog("prices.csv").lookup("aws:p5.48xlarge")
    assert (row.region, row.spot_usd, row.prices_as_of) == ("us-west-2", 20.1, "2026-12-02")
    assert row.source == f"skypilot:{source}"

    (home.parent / "prudent.yaml").write_text("cost: {catalog_file: prices.csv}\n")
    second = _prudent("catalog", "import", str(_copy(home, "v7", "nebius")))
    assert second.exit_code == 0 and len(second.stdout.splitlines()) == 1  # into prices.csv
    both = load_catalog("prices.csv")
    assert both.lookup("aws:p5.48xlarge").spot_usd == 20.1  # kept
    assert both.lookup("nebius:gpu-h100-sxm_1gpu-16vcpu-200gb").spot_usd == 1.25


@pytest.mark.parametrize(("args", "expected"), [
    (["--region", "eu-mars-1"], "unknown region 'eu-mars-1' for aws"),
    (["--as-of", "yesterday"], "--as-of 'yesterday' is not a date"),
    (["--cloud", "gcp"], "prices the GPU apart from the VM"),
])
def test_import_refuses_bad_input_and_leaves_the_catalog_as_it_was(
        home: Path, args: list[str], expected: str) -> None:
    source = _copy(home, "v9", "aws")
    target = home.parent / "prices.csv"
    assert _prudent("catalog", "import", str(source), "--to", str(target)).exit_code == 0
    before = target.read_bytes()
    result = _prudent("catalog", "import", str(source), "--to", str(target), *args)
    assert isinstance(result.exception, ConfigError) and expected in str(result.exception)
    assert target.read_bytes() == before


def test_import_of_a_file_with_a_row_without_price_names_its_line(home: Path) -> None:
    source = home.parent / "aws" / "vms.csv"
    source.parent.mkdir()
    source.write_text("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,"
                      "Region\np5.48xlarge,H100,8,192,2048,,us-east-1\n")
    result = _prudent("catalog", "import", str(source))
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception).startswith(f"{source} line 2: p5.48xlarge in us-east-1 has no "
                                            "Price; fix the row")
    assert not (home.parent / "prudent-prices.csv").exists()


def test_policy_check_warns_once_about_a_stale_price(home: Path) -> None:
    result = CliRunner().invoke(app, ["policy", "check", "--instance", "gcp:a2-highgpu-1g",
                                      "--hours", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("projected cost $7.35: 2 h at $3.67/h")
    (warning,) = [line for line in result.stderr.splitlines() if "warning" in line]
    assert "gcp:a2-highgpu-1g" in warning and "as of 2025-01-15" in warning
    assert "prudent catalog import" in warning


def test_the_bill_names_the_stale_prices_its_runs_were_priced_at(home: Path) -> None:
    from prudent.cost.commands import stale_prices
    from prudent.store.database import Store

    store = Store(f"sqlite:///{home.parent / 'bill.db'}")
    day = 1_796_342_400.0  # 2026-12-04 UTC
    price = {"instance": "gcp:a3-highgpu-8g", "prices_as_of": "2025-01-15",
             "source": "provider list price"}
    for run_id, payload in (("old1", price), ("old2", price),
                            ("fresh", {**price, "instance": "aws:p5.48xlarge",
                                       "prices_as_of": "2026-12-03"})):
        store.create_run(run_id, "x", started_at=day, cost_usd=1.0)
        store.add_events([{"run_id": run_id, "step": 0, "kind": "cost", "name": "price",
                           "message": "", "payload": json.dumps(payload), "wall": day}])
    try:
        assert stale_prices(store, 0.0, 180) == [{
            "instance": "gcp:a3-highgpu-8g", "prices_as_of": "2025-01-15",
            "source": "provider list price", "age_days": 688, "runs": 2}]
        assert stale_prices(store, day + 1, 180) == []  # not in the window
        assert stale_prices(store, 0.0, 700) == []
    finally:
        store.close()
