"""The resume check: a run stopped as if preempted continues, in a new process, bit for bit.

It compares the resumed process's losses with the uninterrupted smoke run's, and when they
differ, whether the random generators (hashed by the probe after every step) differ too.
"""

from __future__ import annotations

import math

from prudent.preflight.result import (
    CheckResult,
    exception_of,
    short,
    skip,
    stale_parameters,
)
from prudent.preflight.runner import PhaseResult, PreflightResult
from prudent.preflight.tracebacks import format_frames

__all__ = ["check_resume"]


def check_resume(result: PreflightResult) -> CheckResult:
    title = "checkpoint round trip and exact resume"
    stop, resume = result.phases.get("stop"), result.phases.get("resume")
    if stop is None:
        return skip("resume", title, "blocked: the smoke run did not complete"
                    if result.phases["smoke"].record else "the script never ran")
    if stop.status != "stopped":
        return CheckResult("resume", title, "fail", f"the run to be interrupted at step "
                           f"{result.stop_at} did not stop cleanly ({stop.status or 'no record'}, "
                           f"exit code {stop.returncode})", "see the error below",
                           format_frames(exception_of(stop)))
    if resume is None or resume.record is None or resume.status == "failed":
        return _resume_crashed(title, result, resume)
    if stale_parameters(result):
        return skip("resume", title, "gradients carry over from step to step (see 'overfits "
                    "one batch'): they are not in a checkpoint, so no resume can be exact")
    if any(not _finite(v) for v in result.phases["smoke"].losses.values()):
        return skip("resume", title, "blocked by the non-finite losses reported above")
    return _compare_resumed(title, result, stop, resume)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _same(a: float | None, b: float | None) -> bool:
    """Bit-for-bit equal losses (two NaNs count as equal: the same computation gave both)."""
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _resume_crashed(title: str, result: PreflightResult, resume: PhaseResult | None) -> CheckResult:
    exc = exception_of(resume) if resume is not None else {"type": "Error", "message": "not run",
                                                           "frames": []}
    return CheckResult("resume", title, "fail", f"stopped at step {result.stop_at} with a "
                       f"checkpoint; the process that resumed from it crashed: {exc['type']}: "
                       f"{short(exc['message'])}", "the checkpoint cannot be restored: its "
                       "keys must match what the script builds on resume (no state key that "
                       "depends on whether the run resumed); fix the error below",
                       format_frames(exc))


def _compare_resumed(title: str, result: PreflightResult, stop: PhaseResult,
                     resume: PhaseResult) -> CheckResult:
    reference, k = result.phases["smoke"].losses, result.stop_at or 0
    before = [s for s, v in stop.losses.items() if not _same(reference.get(s), v)]
    if before:
        return CheckResult("resume", title, "warn", f"two identical runs already differ at step "
                           f"{before[0]} ({stop.losses[before[0]]!r} vs {reference.get(before[0])!r}), "
                           "before any restart: exact resume cannot be checked",
                           "seed every source of randomness (torch.manual_seed, numpy, random, "
                           "the DataLoader's generator)")
    resumed = resume.losses
    if not resumed or min(resumed) != k + 1:
        first = min(resumed) if resumed else None
        return CheckResult("resume", title, "fail", f"stopped at step {k} with a checkpoint, but "
                           f"the new process started at step {first}: it did not resume",
                           "attach every object with run.attach(...) before the loop, and loop "
                           "with run.epochs()/run.batches() or run.steps(n) so prudent can "
                           "reposition it")
    mismatch = [s for s in sorted(resumed) if not _same(reference.get(s), resumed[s])]
    if mismatch:
        s = mismatch[0]
        seen = (f"stopped at step {k}, resumed in a new process: the loss at step {s} is "
                f"{resumed[s]!r}, the uninterrupted run had {reference.get(s)!r}")
        rng = _rng_differs(result.phases["smoke"], resume, k)
        if rng is not None:
            return CheckResult("resume", title, "fail", f"{seen}; the random generators "
                               f"already differed after step {rng}", _RNG_FIX)
        return CheckResult("resume", title, "fail", seen, "some state is not in the "
                           "checkpoint: attach every stateful object (scheduler, GradScaler, "
                           "your own counters) with run.attach(...), and draw randomness from "
                           "torch's generators")
    return CheckResult("resume", title, "pass", f"stopped at step {k} (as if preempted), a new "
                       f"process resumed: its {len(resumed)} losses equal the uninterrupted "
                       f"run's bit for bit, starting with step {k + 1}")


_RNG_FIX = ("the resumed run draws other random numbers than the uninterrupted one: prudent "
            "restores Python's, NumPy's and torch's global generators when run.attach, "
            "run.steps or run.batches starts, so draw batches and dropout from those (a "
            "torch.Generator or np.random.default_rng of your own is not in the checkpoint: "
            "seed it from run.state.step), and draw nothing random before the loop only on "
            "a fresh start")


def _rng_differs(reference: PhaseResult, resume: PhaseResult, k: int) -> int | None:
    """The first step after ``k`` whose generators (hashed by the probe) differ, if any."""
    ref = {s["step"]: s.get("rng") for s in (reference.record or {}).get("steps", [])}
    for entry in (resume.record or {}).get("steps", []):
        step, rng = entry["step"], entry.get("rng")
        if step > k and rng is not None and ref.get(step) is not None and rng != ref[step]:
            return step
    return None
