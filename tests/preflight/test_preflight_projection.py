from __future__ import annotations

import pytest

from prudent.kernel.errors import ConfigError
from prudent.preflight.projection import Price, price_for, project

RECORD = {"step_s": 0.01, "num_epochs": 10, "batches_per_epoch": 100,
          "epochs": [{"epoch": 0, "tail_s": 9.0}, {"epoch": 1, "tail_s": 2.0}],
          "steps": [{}] * 16, "memory": {"peak_rss_bytes": 2**30}}


def test_time_is_epochs_times_batches_times_step_plus_evaluation_over_speedup() -> None:
    p = project(RECORD, speedup=None, price=Price(2.0, "--price-per-hour"), device="cpu")
    assert p.hours == pytest.approx(10 * (100 * 0.01 + 2.0) / 3600)  # last epoch's tail: no scan
    assert p.cost_usd == pytest.approx(p.hours * 2.0)
    assert any("CPU step is not a GPU step" in a for a in p.assumptions)
    faster = project(RECORD, speedup=20, price=None, device="cpu")
    assert faster.hours == pytest.approx(p.hours / 20)
    assert any("20x faster" in a for a in faster.assumptions)
    assert any("no price" in a for a in faster.assumptions)


def test_unknown_length_projects_no_time() -> None:
    p = project({**RECORD, "batches_per_epoch": None}, speedup=None, price=None, device="cpu")
    assert p.hours is None and p.cost_usd is None


def test_price_comes_from_the_catalog_or_the_user() -> None:
    catalog = price_for("aws:g5.xlarge", None, spot=False)
    assert catalog is not None and catalog.usd_per_hour > 0 and "aws:g5.xlarge" in catalog.source
    own = price_for("aws:g5.xlarge", 0.5, spot=False)
    assert own == Price(0.5, "--price-per-hour (aws:g5.xlarge)")
    assert price_for(None, None, spot=False) is None


def test_an_unknown_instance_names_close_matches() -> None:
    with pytest.raises(ConfigError, match="did you mean aws:g5.xlarge"):
        price_for("aws:g5.xlarg", None, spot=False)
    with pytest.raises(ConfigError, match="--speedup must be > 0"):
        project(RECORD, speedup=0, price=None, device="cpu")


def test_a_loop_without_epochs_projects_its_steps_times_the_step_time() -> None:
    loop = {"step_s": 0.02, "num_epochs": None, "batches_per_epoch": None, "num_steps": 5000,
            "epochs": [], "steps": [{}] * 16, "memory": {}}
    p = project(loop, speedup=4, price=Price(3.0, "--price-per-hour"), device="cpu")
    assert p.num_steps == 5000 and p.hours == pytest.approx(5000 * 0.02 / 4 / 3600)
    assert any("smoke iterations" in a for a in p.assumptions)
    assert not any("batches per epoch unknown" in a for a in p.assumptions)


def test_a_stale_catalog_price_says_so_in_the_projection() -> None:
    stale = price_for("gcp:a2-highgpu-1g", None, spot=False)  # a provider list price of 2025
    assert stale is not None and "days old" in stale.source
    assert "prudent catalog import" in stale.source  # how to refresh it


def test_a_frameworks_plan_in_optimizer_steps_wins_over_epochs_times_batches() -> None:
    """Lightning with accumulate_grad_batches=4 over 10 epochs of 100 batches plans 250
    optimizer steps, and a step is timed from one optimizer step to the next: epochs x batches
    x step would project 4x the time (Hugging Face's max_steps ends mid-epoch the same way)."""
    framework = {**RECORD, "num_steps": 250}
    p = project(framework, speedup=None, price=Price(2.0, "--price-per-hour"), device="cpu")
    assert p.hours == pytest.approx((250 * 0.01 + 10 * 2.0) / 3600)
    assert p.num_steps == 250 and p.num_epochs == 10
