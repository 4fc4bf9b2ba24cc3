"""Budgets as deadlines: every money or time limit becomes "seconds left in this attempt".

A price per hour is constant within an attempt, so "$40 total" is the same as "stop at
``(40 - spent before) / price`` seconds". Turning every limit into a deadline keeps the hot
path to one clock read and one comparison per step. The run's own limits (``budget_usd``,
``max_hours``) stop it with reason ``budget`` (exit 4, resumable once raised); the policy's
(per job, per day, per month) with reason ``policy`` (exit 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prudent.cost.policy import Spend
from prudent.cost.settings import CostSettings, PolicySettings
from prudent.kernel.units import parse_hours, parse_usd

__all__ = ["Limit", "limits", "stop_message"]


@dataclass(frozen=True)
class Limit:
    """One limit: why a stop would happen, and after how many seconds of this attempt."""

    reason: str  # "budget" or "policy"
    key: str  # the setting that set it, e.g. "budget_usd" or "policy max_usd_per_day"
    amount: str  # "$40.00" or "12 h"
    seconds_left: float
    fix: str


def limits(cost: CostSettings, policy: PolicySettings, hourly_usd: float, prior_usd: float,
           prior_s: float, spend: Spend, run_id: str) -> list[Limit]:
    """Every limit that applies, soonest first (``inf`` seconds when the price is $0)."""
    rerun = f"then rerun with --run-id {run_id} to resume from the checkpoint"
    found = [
        _money("budget", "budget_usd", cost.budget_usd, prior_usd, hourly_usd,
               f"raise it (--budget-usd, cost.budget_usd) and {rerun}"),
        _time("budget", "max_hours", cost.max_hours, prior_s,
              f"raise it (--max-hours, cost.max_hours) and {rerun}"),
        _money("policy", "policy max_usd_per_job", policy.max_usd_per_job, prior_usd,
               hourly_usd, "the policy caps every job; ask its owner for an exception"),
        _time("policy", "policy max_hours_per_job", policy.max_hours_per_job, prior_s,
              "the policy caps every job; ask its owner for an exception"),
        _money("policy", "policy max_usd_per_day", policy.max_usd_per_day,
               spend.day_usd + prior_usd, hourly_usd, f"wait for the next UTC day, {rerun}"),
        _money("policy", "policy max_usd_per_month", policy.max_usd_per_month,
               spend.month_usd + prior_usd, hourly_usd, f"wait for the next month, {rerun}"),
    ]
    return sorted((lim for lim in found if lim is not None), key=lambda lim: lim.seconds_left)


def _money(reason: str, key: str, raw: float | str | None, spent: float, hourly_usd: float,
           fix: str) -> Limit | None:
    if raw is None:
        return None
    usd = parse_usd(raw)
    left = (usd - spent) / hourly_usd * 3600 if hourly_usd > 0 else math.inf
    if hourly_usd <= 0 and spent >= usd:
        left = 0.0
    return Limit(reason, key, f"${usd:.2f}", left, fix)


def _time(reason: str, key: str, raw: float | str | None, spent_s: float, fix: str) -> Limit | None:
    if raw is None:
        return None
    hours = parse_hours(raw)
    return Limit(reason, key, f"{hours:g} h", hours * 3600 - spent_s, fix)


def stop_message(limit: Limit, total_usd: float, total_s: float, hourly_usd: float,
                 attempts: int) -> str:
    """``budget_usd $3.00 reached: spent $2.98 in 0.002 h over 2 attempts at $3600.00/h; ...``"""
    return (f"{limit.key} {limit.amount} reached: spent ${total_usd:.2f} in {_span(total_s)} "
            f"over {attempts} attempt{'s' * (attempts != 1)} at ${hourly_usd:.2f}/h; a "
            f"checkpoint is saved; {limit.fix}")


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"
