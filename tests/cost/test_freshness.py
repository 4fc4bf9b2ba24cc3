"""A stale price is said once, naming the source, its date and how to refresh; what priced a
job travels with it."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from prudent.cost.catalog import COLUMNS, load_catalog
from prudent.cost.freshness import age_days, pricing, stale_price_warning, stale_warning
from prudent.cost.policy import job_from_settings
from prudent.cost.settings import CostSettings

TODAY = date(2026, 12, 3)
CATALOG = load_catalog()


def test_a_price_older_than_the_setting_names_source_date_and_refresh() -> None:
    row = CATALOG.lookup("gcp:a3-highgpu-8g")
    warning = stale_warning(row, 180, TODAY)
    assert warning is not None
    assert warning.startswith("the price of gcp:a3-highgpu-8g is 687 days old (as of 2025-01-15, "
                              f"source {row.source}; cost.stale_after_days=180): ")
    assert "prudent catalog import" in warning and "install SkyPilot" in warning
    assert stale_warning(row, 700, TODAY) is None


def test_current_and_undated_prices_give_no_warning() -> None:
    assert stale_warning(CATALOG.lookup("aws:p5.48xlarge"), 180, TODAY) is None
    assert age_days("", TODAY) is None and age_days("2026-06-06", TODAY) == 180


def test_pricing_names_the_source_of_the_jobs_price() -> None:
    job = job_from_settings(CostSettings(instance="azure:Standard_ND96isr_H100_v5"), CATALOG)
    priced = pricing(job, 180, TODAY)
    assert priced["source"] == job.instance.source and "687 days old" in priced["stale"]
    own = job_from_settings(CostSettings(instance="azure:Standard_ND96isr_H100_v5",
                                         hourly_usd="$40"), CATALOG)
    assert pricing(own, 180, TODAY) == {"source": "cost.hourly_usd", "stale": None}
    assert pricing(job_from_settings(CostSettings(), CATALOG), 180, TODAY) == {
        "source": None, "stale": None}


def test_the_preflight_projection_can_ask_for_the_warning(tmp_path: Path) -> None:
    assert "687 days old" in (stale_price_warning("gcp:a2-highgpu-1g", None, TODAY) or "")
    assert stale_price_warning("aws:p5.4xlarge", None, TODAY) is None
    assert stale_price_warning(None, None, TODAY) is None
    assert stale_price_warning("aws:nope", None, TODAY) is None  # the lookup reports it
    mine = tmp_path / "mine.csv"
    mine.write_text(",".join(COLUMNS) + "\nonprem,dgx,lab,V100,8,80,512,5,,2026-11-01,rates\n")
    assert stale_price_warning("onprem:dgx", CostSettings(catalog_file=str(mine),
                                                          stale_after_days=10), TODAY) == (
        "the price of onprem:dgx is 32 days old (as of 2026-11-01, source rates; "
        "cost.stale_after_days=10): refresh with `prudent catalog import "
        "~/.sky/catalogs/<version>/<cloud>/vms.csv`, or install SkyPilot (pip install "
        "skypilot; its local catalog is used where newer), or put your own prices in "
        "cost.catalog_file")
