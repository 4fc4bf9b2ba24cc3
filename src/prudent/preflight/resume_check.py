"""The resume check: a run stopped as if preempted continues, in a new process, bit for bit.

It compares the resumed process's losses with the uninterrupted smoke run's, and when they
differ, whether the random generators (hashed by the probe after every step) differ too.
"""

from __future__ import annotations

import math
from typing import Any

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
        rng = _generators_differ(result.phases["smoke"], stop, resume, k)
        if rng is not None:
            step, names = rng
            return CheckResult("resume", title, "fail", f"{seen}; the random generators "
                               f"({', '.join(names)}) already differed after step {step}",
                               _RNG_FIX)
        fed = _first_difference("inputs", result.phases["smoke"], resume, k)
        if fed is not None:
            return CheckResult("resume", title, "fail", f"{seen}; at step {fed} the model was "
                               "fed other batches than in the uninterrupted run, though "
                               "prudent's generators were the same", _SOURCE_FIX)
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


_SOURCE_FIX = ("the batches come from somewhere the checkpoint does not hold (a "
               "torch.Generator or np.random.default_rng of your own, an iterator over a file): "
               "draw them from the global generators, which prudent restores, or seed your "
               "generator from run.state.step, or attach an object with state_dict() that "
               "holds its position")


def _generators_differ(reference: PhaseResult, stop: PhaseResult, resume: PhaseResult,
                       k: int) -> tuple[int, list[str]] | None:
    """The first step after ``k`` where a generator differs from the uninterrupted run's, and
    which. Only generators the stop process had exactly as the smoke run count: one the script
    never seeds (Python's ``random`` starts from the OS in every process) differs anyway."""
    ref = _by_step(reference, "rng")
    seeded = None
    for step, hashes in _by_step(stop, "rng").items():
        if hashes and ref.get(step):
            same = {name for name, value in hashes.items() if ref[step].get(name) == value}
            seeded = same if seeded is None else seeded & same
    for step, hashes in sorted(_by_step(resume, "rng").items()):
        if step > k and hashes and ref.get(step):
            names = sorted(n for n in seeded or () if hashes.get(n) != ref[step].get(n))
            if names:
                return step, names
    return None


def _by_step(phase: PhaseResult, key: str) -> dict[int, Any]:
    return {s["step"]: s.get(key) for s in (phase.record or {}).get("steps", [])}


def _first_difference(key: str, reference: PhaseResult, resume: PhaseResult,
                      k: int) -> int | None:
    """The first step after ``k`` whose ``key`` (a hash the probe took: the generators after
    the step, or the model's training inputs) differs from the uninterrupted run's."""
    ref = {s["step"]: s.get(key) for s in (reference.record or {}).get("steps", [])}
    for entry in (resume.record or {}).get("steps", []):
        step, value = entry["step"], entry.get(key)
        if step > k and value is not None and ref.get(step) is not None and value != ref[step]:
            return step
    return None
