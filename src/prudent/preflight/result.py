"""What every preflight check returns, and the helpers the checks share.

A :class:`CheckResult` has a status (``pass``, ``warn``, ``fail``, ``skip``, or ``untestable``:
the script cannot run on this machine at all, e.g. it selects CUDA), one line saying
what was seen (with the numbers), a fix when something is wrong, and optional detail (a trimmed
traceback, parameter names).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from prudent.preflight.runner import PhaseResult, PreflightResult
from prudent.preflight.tracebacks import parse_stderr

__all__ = ["CheckResult", "exception_of", "script_name", "short", "skip", "stale_parameters",
           "title_of"]

_TITLES = {"batches": "batch shapes and dtypes are consistent",
           "cost": "step time, peak memory, projected time and cost"}


@dataclass
class CheckResult:
    id: str
    title: str
    status: str  # pass | warn | fail | skip | untestable
    summary: str
    fix: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def script_name(command: list[str]) -> str:
    scripts = [a for a in command if a.endswith(".py")]
    return scripts[0].rsplit("/", 1)[-1] if scripts else command[0]


def title_of(check_id: str) -> str:
    return _TITLES[check_id]


def skip(check_id: str, title: str, why: str) -> CheckResult:
    return CheckResult(check_id, title, "skip", why)


def short(message: str, limit: int = 200) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= limit else first[:limit] + "..."


def exception_of(phase: PhaseResult) -> dict[str, Any]:
    record = phase.record or {}
    return (record.get("exception") or parse_stderr(phase.stderr)
            or {"type": "Error", "message": f"exit code {phase.returncode}", "frames": []})


def stale_parameters(result: PreflightResult) -> list[str]:
    records = [p.record for p in result.phases.values() if p.record is not None]
    return sorted({n for r in records for n in r.get("gradients", {}).get("stale", [])})
