"""How old a price is, and what priced a run: a stale price is said once, with the fix.

Used where a price meets a decision: when a run starts (the meter's ``cost/price`` event
carries ``source`` and ``stale``), in ``prudent policy check``, ``prudent cost`` and the
preflight projection (:func:`stale_price_warning`).
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prudent.cost.catalog import InstanceType
    from prudent.cost.policy import Job
    from prudent.cost.settings import CostSettings

__all__ = ["REFRESH", "age_days", "pricing", "stale_price_warning", "stale_warning"]

REFRESH = ("refresh with `prudent catalog import ~/.sky/catalogs/<version>/<cloud>/vms.csv`, "
           "or install SkyPilot (pip install skypilot; its local catalog is used where newer), "
           "or put your own prices in cost.catalog_file")


def today_utc() -> date:
    return datetime.now(timezone.utc).date()


def age_days(as_of: str | None, today: date | None = None) -> int | None:
    """Days since ``as_of`` (an ISO date); None when the price carries no date."""
    try:
        return ((today or today_utc()) - date.fromisoformat(as_of or "")).days
    except ValueError:
        return None


def stale_warning(row: InstanceType, max_age_days: int, today: date | None = None) -> str | None:
    """One line naming the row's source, its date and the refresh, if older than allowed."""
    age = age_days(row.prices_as_of, today)
    if age is None or age <= max_age_days:
        return None
    return (f"the price of {row.ref} is {age} days old (as of {row.prices_as_of}, source "
            f"{row.source}; cost.stale_after_days={max_age_days}): {REFRESH}")


def pricing(job: Job, max_age_days: int, today: date | None = None) -> dict[str, Any]:
    """What priced the job (``source``) and the staleness warning (``stale``, or None)."""
    if job.node_hourly_usd is not None:
        return {"source": "cost.hourly_usd", "stale": None}
    if job.instance is None:
        return {"source": None, "stale": None}
    return {"source": job.instance.source,
            "stale": stale_warning(job.instance, max_age_days, today)}


def stale_price_warning(instance: str | None, cost: CostSettings | str | None = None,
                        today: date | None = None) -> str | None:
    """For a projection (preflight): the warning for ``instance``'s catalog price, or None.

    ``cost``: the cost settings (or just ``cost.catalog_file``). An unknown instance gives
    None here; the projection's own lookup reports it.
    """
    from prudent.cost.catalog import load_catalog
    from prudent.cost.settings import CostSettings
    from prudent.kernel.errors import ConfigError

    if not instance:
        return None
    settings = cost if isinstance(cost, CostSettings) else CostSettings(catalog_file=cost)
    try:
        row = load_catalog(settings).lookup(instance)
    except ConfigError:
        return None
    return stale_warning(row, settings.stale_after_days, today)
