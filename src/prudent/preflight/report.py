"""The verdict: the checklist as text for a person or as JSON for a program."""

from __future__ import annotations

import json
from typing import Any

from prudent.preflight.projection import Projection
from prudent.preflight.result import CheckResult, script_name, title_of
from prudent.preflight.runner import PreflightResult

__all__ = ["as_json", "as_text", "projection_check", "verdict_ok"]

_MARKS = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP", "untestable": "N/A "}


def projection_check(result: PreflightResult, projection: Projection | None) -> CheckResult:
    title = title_of("cost")
    if projection is None or projection.step_s is None:
        return CheckResult("cost", title, "skip", "no step was timed")
    p = projection
    memory = f", peak memory {_mb(p.peak_rss_bytes)} RSS" if p.peak_rss_bytes else ""
    if p.cuda_peak_bytes:
        memory += f", {_mb(p.cuda_peak_bytes)} CUDA"
    measured = f"step {p.step_s * 1000:.1f} ms{memory}"
    if p.hours is None:
        return CheckResult("cost", title, "warn", f"{measured}; the full run's length is unknown",
                           "give the loader a len() so preflight can count batches per epoch, "
                           "or loop with run.steps(n)", _lines(p.assumptions))
    speed = f" / {p.speedup:g}" if p.speedup != 1 else ""
    if p.num_epochs is None and p.num_steps:
        plan = (f"{p.num_steps} steps x {p.step_s * 1000:.1f} ms{speed} = "
                f"{_duration(p.hours)}")
    elif p.num_steps:  # a framework's plan in optimizer steps, over epochs
        plan = (f"{p.num_steps} optimizer steps x {p.step_s * 1000:.1f} ms + {p.num_epochs} "
                f"epochs x {p.epoch_tail_s:.2f} s evaluation{speed} = {_duration(p.hours)}")
    else:
        plan = (f"{p.num_epochs} epochs x {p.batches_per_epoch} batches x "
                f"{p.step_s * 1000:.1f} ms + {p.epoch_tail_s:.2f} s evaluation per epoch{speed}"
                f" = {_duration(p.hours)}")
    cost = ""
    if p.price is not None and p.cost_usd is not None:
        amount = f"${p.cost_usd:,.2f}" if p.cost_usd >= 0.01 else "under $0.01"
        cost = f", {amount} at ${p.price.usd_per_hour:.4g}/h"
    return CheckResult("cost", title, "pass", f"{measured}; full run: {plan}{cost}",
                       detail=_lines(p.assumptions))


def verdict_ok(checks: list[CheckResult]) -> bool:
    """No check failed, and the script could be tested here at all."""
    return not any(c.status in ("fail", "untestable") for c in checks)


def as_text(result: PreflightResult, checks: list[CheckResult]) -> str:
    lines = [f"preflight of {' '.join(result.command)} ({_shortened(result)}, "
             f"{result.seconds:.1f} s)"]
    for check in checks:
        lines.append(f"  {_MARKS[check.status]}  {check.title}: {check.summary}")
        if check.fix and check.status in ("fail", "warn", "untestable"):
            lines.append(f"        fix: {check.fix}")
        if check.detail:
            lines += [f"        {line}" for line in check.detail.splitlines()]
    failed = [c for c in checks if c.status == "fail"]
    warned = [c for c in checks if c.status == "warn"]
    if any(c.status == "untestable" for c in checks):
        lines.append(f"{script_name(result.command)} could not be tested on this machine: "
                     "nothing is known of how it would do in the cloud (see above)")
    elif failed:
        lines.append(f"{script_name(result.command)} is not ready for the cloud: "
                     f"{len(failed)} check(s) failed ({', '.join(c.id for c in failed)})")
    else:
        extra = f", {len(warned)} warning(s)" if warned else ""
        lines.append(f"ready: nothing failed{extra}")
    return "\n".join(lines)


def as_json(result: PreflightResult, checks: list[CheckResult],
            projection: Projection | None) -> str:
    document: dict[str, Any] = {
        "ok": verdict_ok(checks), "command": result.command, "seconds": round(result.seconds, 2),
        "steps_per_epoch": result.steps, "resume_stop_step": result.stop_at,
        "checks": [c.as_dict() for c in checks],
        "projection": projection.as_dict() if projection else None,
        "processes": {name: {"exit_code": p.returncode, "seconds": p.seconds,
                             "status": p.status, "timed_out": p.timed_out}
                      for name, p in result.phases.items()}}
    return json.dumps(document, indent=2)


def _shortened(result: PreflightResult) -> str:
    """How smoke mode shortened the loop: batches per epoch, or steps of run.steps."""
    smoke = result.phases.get("smoke")
    record = (smoke.record if smoke is not None else None) or {}
    if record.get("num_epochs") is None and record.get("num_steps") is not None:
        return f"{len(record.get('steps', []))} of {record['num_steps']} steps"
    return f"{result.steps} batches per epoch"


def _lines(items: list[str]) -> str:
    return "\n".join(f"assumes: {item}" for item in items)


def _mb(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.0f} MiB"


def _duration(hours: float) -> str:
    seconds = hours * 3600
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{hours:.1f} h"
