"""What the full run would take: time from the smoke run's measurements, cost from a price.

    hours = epochs x (batches per epoch x step time + per-epoch evaluation time) / speedup
    hours = steps (the n of run.steps) x step time / speedup          (a loop without epochs)
    cost  = hours x price per hour (the catalog's for --instance, or --price-per-hour)

Every number that is an assumption rather than a measurement is said so, in ``assumptions``:
a CPU step is not a GPU step, and only the user knows how much faster their target is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from prudent.kernel.errors import ConfigError

__all__ = ["Price", "Projection", "price_for", "project"]


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: str  # "aws:g5.xlarge on demand, catalog prices as of 2025-01-15" / "--price-per-hour"


@dataclass
class Projection:
    step_s: float | None  # measured median step time (data wait + compute)
    epoch_tail_s: float  # measured time per epoch outside the training steps (evaluation, ...)
    num_epochs: int | None
    batches_per_epoch: int | None
    num_steps: int | None  # the n of run.steps(n), in a loop without epochs
    speedup: float
    hours: float | None
    price: Price | None
    cost_usd: float | None
    peak_rss_bytes: int | None
    cuda_peak_bytes: int | None
    assumptions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def price_for(instance: str | None, price_per_hour: float | None, spot: bool,
              catalog_file: str | None = None) -> Price | None:
    """The user's hourly price wins; otherwise the catalog's for ``instance``; else None."""
    if price_per_hour is not None:
        if price_per_hour < 0:
            raise ConfigError(f"--price-per-hour must be >= 0, got {price_per_hour}")
        what = f" ({instance})" if instance else ""
        return Price(price_per_hour, f"--price-per-hour{what}")
    if instance is None:
        return None
    from prudent.cost.catalog import load_catalog
    from prudent.cost.freshness import stale_price_warning

    row = load_catalog(catalog_file).lookup(instance)  # an unknown name: ConfigError, close matches
    kind = "spot" if spot and row.spot_usd is not None else "on demand"
    stale = stale_price_warning(instance, catalog_file)
    return Price(row.hourly_usd(spot), f"{row.ref} {kind}, catalog prices as of "
                 f"{row.prices_as_of}" + (f" ({stale})" if stale else ""))


def project(record: dict[str, Any], *, speedup: float | None, price: Price | None,
            device: str) -> Projection:
    """The full run's time and cost from one smoke run's probe record."""
    if speedup is not None and speedup <= 0:
        raise ConfigError(f"--speedup must be > 0, got {speedup}")
    tails = [e["tail_s"] for e in record.get("epochs", []) if e.get("tail_s") is not None]
    tail = tails[-1] if tails else 0.0  # the last epoch's: the first one's includes the data scan
    step_s, epochs, batches = record.get("step_s"), record.get("num_epochs"), record.get(
        "batches_per_epoch")
    # the planned optimizer steps, where known: run.steps(n), or a framework's own plan (Hugging
    # Face's max_steps, Lightning's estimate with gradient accumulation), which epochs x
    # batches would overstate (a step there is several batches, or the run ends mid-epoch)
    num_steps = record.get("num_steps")
    factor = speedup or 1.0
    hours = None
    if step_s and num_steps:
        hours = (num_steps * step_s + (epochs or 0) * tail) / factor / 3600
    elif step_s and epochs and batches:
        hours = epochs * (batches * step_s + tail) / factor / 3600
    memory = record.get("memory", {})
    return Projection(step_s, tail, epochs, batches, num_steps, factor, hours, price,
                      hours * price.usd_per_hour if hours is not None and price else None,
                      memory.get("peak_rss_bytes"), memory.get("cuda_max_allocated_bytes"),
                      _assumptions(record, speedup, price, device, len(tails)))


def _assumptions(record: dict[str, Any], speedup: float | None, price: Price | None,
                 device: str, num_tails: int) -> list[str]:
    steps = len(record.get("steps", []))
    said = [(f"step time: the median of {max(0, steps - 1)} smoke steps on {device}, with the "
             "script's batch size, data loading included")]
    iterations = record.get("num_epochs") is None and record.get("num_steps")
    if iterations:
        said[0] = (f"step time: the median of {max(0, steps - 1)} smoke iterations on {device} "
                   "(from one run.step to the next: drawing batches, every micro-step, the "
                   "optimizer step), with the script's batch size")
        said.append("evaluation between steps (run.log every so many steps) is not in the "
                    "median: add its time per evaluation x the number of evaluations")
    if speedup is not None:
        said.append(f"the target is assumed {speedup:g}x faster than this {device} (--speedup)")
    elif device == "cpu":
        said.append("no speedup applied: a CPU step is not a GPU step, so on a GPU this is an "
                    "upper bound; pass --speedup X, or run preflight on the target with "
                    "--device cuda for a measured step time")
    if num_tails:
        said.append("per-epoch evaluation and epoch-end work: as measured in the smoke run's "
                    "last epoch (the full validation loop runs in smoke mode)")
    if not iterations and not record.get("batches_per_epoch"):
        said.append("batches per epoch unknown (the loader has no len()): no time projected")
    said.append("no restarts, no preemptions, storage as fast as here")
    if price is None:
        said.append("no price: pass --instance cloud:type (see `prudent catalog`) or "
                    "--price-per-hour X")
    else:
        said.append(f"price ${price.usd_per_hour:.4g}/h: {price.source}")
    return said
