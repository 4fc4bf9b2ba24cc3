"""The bill: what the project's runs cost, and where money was wasted or saved.

Everything comes from the store: ``runs.cost_usd`` (all attempts of a run id) and the events
the meter, the checkpointer and the kernel recorded. The attempts of one run are told apart by
the meter's ``cost/price`` event, which each attempt writes when it starts.

- spent: stored cost of the runs started since ``since``;
- wasted on crashes: for each attempt that failed or was killed, the time since its newest
  checkpoint (or since it started) at its price: work that has to be done again;
- stopped early: the cost of runs a rule stopped or the tuner pruned, and what they would have
  cost had they run to the end: spent x planned steps / steps done (the meter records both;
  it assumes the steps to come would have taken as long as those done, setup included, so it
  leans high for short runs). ``saved_early_stop_usd`` is the difference;
- data wait: accelerator time spent waiting for the next batch (the profiler's ``data``
  share), at the attempt's price, for attempts on a machine with GPUs;
- saved on spot: the on-demand price of the same hours minus what spot cost.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from prudent.kernel.stop import StopReason

if TYPE_CHECKING:
    from prudent.store.database import Store

__all__ = ["BY", "BillLine", "bill"]

BY = ("run", "name", "day", "instance")


@dataclass
class BillLine:
    key: str
    runs: int = 0
    attempts: int = 0  # on every machine (a new machine imports the others' with the record)
    spent_usd: float = 0.0
    wasted_crash_usd: float = 0.0
    stopped_early_usd: float = 0.0
    stopped_early_full_usd: float = 0.0
    saved_early_stop_usd: float = 0.0
    data_wait_usd: float = 0.0
    saved_spot_usd: float = 0.0
    hours: float = 0.0
    run_ids: list[str] = field(default_factory=list)
    instance: str | None = None  # of one run's newest attempt; not summed

    def add(self, other: BillLine) -> None:
        for name in ("runs", "attempts", "spent_usd", "wasted_crash_usd", "stopped_early_usd",
                     "stopped_early_full_usd", "saved_early_stop_usd", "data_wait_usd",
                     "saved_spot_usd", "hours"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.run_ids += other.run_ids
        # a group's instance: the one its runs share (by instance: the key), else none
        self.instance = other.instance if self.runs == other.runs else (
            self.instance if self.instance == other.instance else None)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name, value in out.items():
            if isinstance(value, float):
                out[name] = round(value, 4)
        return out


def bill(store: Store, since: float = 0.0, by: str = "run") -> tuple[BillLine, list[BillLine]]:
    """The total and one line per group (``by`` one of :data:`BY`), dearest first."""
    groups: dict[str, BillLine] = defaultdict(lambda: BillLine(""))
    total = BillLine("total")
    for run in store.list_runs():
        if run["started_at"] < since:
            continue
        line = run_line(run, store.events(run["id"]))
        key = _group_key(run, line, by)
        groups[key].key = key
        groups[key].add(line)
        total.add(line)
    return total, sorted(groups.values(), key=lambda g: (-g.spent_usd, g.key))


def run_line(run: dict[str, Any], events: list[dict[str, Any]]) -> BillLine:
    """One run's numbers, from its stored cost and events."""
    attempts = _attempts(events)
    spent = float(run["cost_usd"] or 0.0)
    reason = StopReason.parse(run["stop_reason"]) if run["stop_reason"] else None
    early = spent if reason is not None and reason.ends_early else 0.0
    full = _full_cost(spent, attempts) if early else 0.0
    line = BillLine(run["id"], runs=1, attempts=len(attempts), spent_usd=spent, stopped_early_usd=early,
                    stopped_early_full_usd=full, saved_early_stop_usd=full - early,
                    run_ids=[run["id"]])
    for attempt in attempts:
        line.hours += attempt["seconds"] / 3600
        line.wasted_crash_usd += attempt["lost_s"] * attempt["hourly_usd"] / 3600
        line.saved_spot_usd += attempt["saved_usd"]
        line.data_wait_usd += attempt["data_wait_usd"]
    line.instance = attempts[-1].get("instance") if attempts else None
    return line


def _full_cost(spent: float, attempts: list[dict[str, Any]]) -> float:
    """What a run stopped early would have cost to its planned end (``spent`` if unknown)."""
    meter = next((a["meter"] for a in reversed(attempts) if a["meter"]), None) or {}
    step, planned = meter.get("steps_done"), meter.get("planned_steps")
    if not step or not planned or planned <= step:
        return spent
    return spent * planned / step


def _attempts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each attempt from its ``cost/price`` event to the next attempt's start. A new attempt
    begins at its ``lifecycle/start`` (written, with the record's import, before its price):
    those events are not the previous attempt's, which otherwise ended (and lost its work) at
    the next machine's start. An attempt whose machine vanished has no ``cost/meter`` event;
    its length is in the ``checkpoint/record_lost`` event the next machine wrote."""
    attempts: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    starting: float | None = None  # a new attempt's lifecycle/start, until its price
    for event in events:
        kind, name, payload = event["kind"], event["name"], event["payload"]
        if (kind, name) == ("cost", "price"):
            start = event["wall"] if starting is None else starting
            current = {"start": start, "end": event["wall"], "saved_at": None, "status": None,
                       "meter": None, **payload}
            attempts.append(current)
            starting = None
            continue
        if (kind, name) == ("lifecycle", "start"):
            current, starting = None, event["wall"]
        if current is None:
            continue
        current["end"] = event["wall"]
        if (kind, name) == ("checkpoint", "saved"):
            current["saved_at"] = event["wall"]
        elif (kind, name) == ("lifecycle", "end"):
            current["status"] = payload.get("status")
        elif (kind, name) == ("cost", "meter"):
            current["meter"] = payload
        elif (kind, name) == ("checkpoint", "record_lost") and current["meter"] is None:
            current["meter"] = {"attempt_s": payload.get("attempt_s")}
        elif (kind, name) == ("profile", "summary"):
            current["data_s"] = payload.get("breakdown", {}).get("data", {}).get("s", 0.0)
    return [_settle(a) for a in attempts]


def _settle(attempt: dict[str, Any]) -> dict[str, Any]:
    meter = attempt["meter"] or {}
    seconds = meter.get("attempt_s")
    seconds = float(seconds if seconds is not None else attempt["end"] - attempt["start"])
    hourly = float(attempt.get("hourly_usd") or 0.0)
    crashed = attempt["status"] in (None, "failed")
    lost = attempt["end"] - (attempt["saved_at"] or attempt["start"]) if crashed else 0.0
    on_demand = float(attempt.get("on_demand_hourly_usd") or hourly)
    saved = (on_demand - hourly) * seconds / 3600
    waiting = float(attempt.get("data_s") or 0.0) if attempt.get("gpus") else 0.0
    return {**attempt, "seconds": seconds, "lost_s": max(0.0, lost), "hourly_usd": hourly,
            "saved_usd": saved, "data_wait_usd": waiting * hourly / 3600}


def _group_key(run: dict[str, Any], line: BillLine, by: str) -> str:
    if by == "name":
        return str(run["name"])
    if by == "day":
        return datetime.fromtimestamp(run["started_at"], timezone.utc).strftime("%Y-%m-%d")
    if by == "instance":
        return line.instance or "(none)"
    return str(run["id"])


def since_timestamp(text: str | None, now: float | None = None) -> float:
    """``7d``, ``12h``, ``2026-12-01`` -> a UNIX time; None -> 0 (everything)."""
    from prudent.kernel.errors import ConfigError
    from prudent.kernel.units import parse_duration_s

    if not text:
        return 0.0
    now = time.time() if now is None else now
    try:
        day = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
        return day.timestamp()
    except ValueError:
        pass
    try:
        return now - parse_duration_s(text)
    except ConfigError:
        raise ConfigError(f"--since {text!r} is invalid: write a duration back from now "
                          "('7d', '12h') or a UTC date ('2026-12-01')") from None
