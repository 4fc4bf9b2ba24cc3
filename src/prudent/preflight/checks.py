"""The checklist: what the preflight processes recorded, judged line by line.

Each check returns a :class:`CheckResult` with a status (``pass``, ``warn``, ``fail`` or
``skip``), one line saying what was seen (with the numbers), a fix when something is wrong,
and optional detail (a trimmed traceback, parameter names). A check that depends on a process
that crashed for a reason another check already reports says ``skip``, so one bug fails the
check that names it rather than every check downstream of it. The batch check and the resume
check live in their own modules (``batch_check``, ``resume_check``); what all checks share is in
``result``.
"""

from __future__ import annotations

import math
from typing import Any

from prudent.preflight.batch_check import check_batches
from prudent.preflight.probe import OVERFIT_FACTOR
from prudent.preflight.result import (
    CheckResult,
    exception_of,
    script_name,
    short,
    skip,
    stale_parameters,
)
from prudent.preflight.resume_check import check_resume
from prudent.preflight.runner import PhaseResult, PreflightResult
from prudent.preflight.tracebacks import format_frames, parse_stderr, user_frames

__all__ = ["CHECKS", "CheckResult", "check_batches", "check_finite", "check_gradients",
           "check_overfit", "check_resume", "check_runs", "run_checks", "script_name"]


def run_checks(result: PreflightResult) -> list[CheckResult]:
    return [check(result) for check in CHECKS]


# runs end to end ------------------------------------------------------------------------------
def check_runs(result: PreflightResult) -> CheckResult:
    title = "runs end to end (train, evaluation, epoch end, checkpoints)"
    smoke, name = result.phases["smoke"], script_name(result.command)
    if smoke.record is None:
        return _no_record(title, smoke, name)
    record = smoke.record
    if smoke.timed_out:
        return CheckResult("runs", title, "fail", f"{name} did not finish within "
                           f"{smoke.seconds:.0f} s in smoke mode", "make sure the loop goes "
                           "through run.epochs() and run.batches(), or run.steps(n) (smoke mode "
                           "shortens them), or raise --timeout")
    if record["status"] == "failed":
        return _crashed(title, smoke, name)
    if not record["steps"]:
        return CheckResult("runs", title, "fail", f"{name} called prudent.init() but never "
                           "run.step(): nothing was trained", "call run.step(loss=loss) once per "
                           "optimisation step, inside `for batch in run.batches(loader)` or "
                           "`for it in run.steps(max_iters)`")
    if smoke.cut_short:
        return CheckResult("runs", title, "warn", f"{_what_ran(record, result.steps)}; the loop "
                           "counts its own iterations, so smoke mode had to stop it: the code "
                           "after the loop (saving the model, a last evaluation) did not run",
                           "loop with `for it in run.steps(max_iters):` (or `for batch in "
                           "run.batches(loader)`): smoke mode then ends the loop itself, a resumed "
                           "run goes on from its step, and preflight projects the full run")
    if record["status"] == "stopped":
        return CheckResult("runs", title, "warn", f"stopped early ({record['stop_reason']}) at "
                           f"step {record['final_step']}: the rest of the loop was not exercised",
                           "see the other checks; a stop by a budget or policy comes from your "
                           "prudent.yaml")
    if smoke.returncode != 0 and record["status"] == "completed":
        exc = parse_stderr(smoke.stderr) or exception_of(smoke)
        return CheckResult("runs", title, "fail", f"training completed, then {name} crashed "
                           f"after the `with run:` block: {exc['type']}: {short(exc['message'])}",
                           "the code after training (saving the final model, a report) runs "
                           "only once, at the very end of the cloud run: fix it now",
                           format_frames(exc))
    return CheckResult("runs", title, "pass", f"{_what_ran(record, result.steps)}, exit code "
                       f"{smoke.returncode} ({smoke.seconds:.1f} s)")


def is_iteration_loop(record: dict[str, Any]) -> bool:
    """The loop counts steps (run.steps, or its own counter), not epochs."""
    return record.get("num_epochs") is None


def _what_ran(record: dict[str, Any], batches: int) -> str:
    steps, logs = len(record["steps"]), record.get("num_logs", 0)
    evaluated = f", run.log called {logs} time(s) (evaluation)" if logs else ""
    if not is_iteration_loop(record):
        return (f"{steps} steps over {len(record['epochs'])} epoch(s) of {batches} batches, "
                "evaluation and epoch-end code included")
    if record.get("num_steps") is not None:
        return (f"{steps} of run.steps({record['num_steps']})'s iterations (smoke mode stops "
                f"early){evaluated}")
    return f"{steps} steps{evaluated}"


def _no_record(title: str, smoke: PhaseResult, name: str) -> CheckResult:
    if smoke.timed_out:
        return CheckResult("runs", title, "fail", f"{name} did not call prudent.init() within "
                           f"{smoke.seconds:.0f} s: it may be training in full, without prudent",
                           _INIT_FIX)
    failure = parse_stderr(smoke.stderr)
    if smoke.returncode != 0 and failure is not None:
        return CheckResult("runs", title, "fail", f"{name} crashed before prudent.init(): "
                           f"{failure['type']}: {failure['message']}", "fix the error below",
                           format_frames(failure))
    if smoke.returncode != 0:
        return CheckResult("runs", title, "fail", f"{name} exited with code {smoke.returncode} "
                           "before prudent.init()", "run it directly to see why",
                           smoke.stderr[-2000:])
    return CheckResult("runs", title, "fail", f"{name} never called prudent.init(): preflight "
                       "cannot shorten or watch a loop prudent does not see", _INIT_FIX)


_INIT_FIX = ("add `run = prudent.init(config=...)`, `run.attach(model=..., optimizer=...)`, "
             "`with run:` and loop with run.epochs()/run.batches(), run.backward(loss) and "
             "run.step(loss=loss) (see the README's five lines)")


# what torch says when a script asks for CUDA on a machine without it
_NO_CUDA = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver",
            "No CUDA GPUs are available", "CUDA driver initialization failed",
            "no CUDA-capable device")


def _crashed(title: str, phase: PhaseResult, name: str) -> CheckResult:
    exc = exception_of(phase)
    if any(sign in exc.get("message", "") for sign in _NO_CUDA):
        # the script's choice of device, not a bug the cloud would meet there
        return CheckResult("runs", title, "untestable", f"cannot test here: {name} selects "
                           f"cuda, which this machine does not have ({exc['type']}: "
                           f"{short(exc['message'])})", "let prudent choose the device: "
                           "model.to(run.device) (preflight sets it to cpu), or pass the "
                           "script's own device option in the command (nanoGPT: --device=cpu); "
                           "or run preflight on the GPU machine with --device cuda",
                           format_frames(exc))
    record = phase.record or {}
    where = _where(record)
    frames = user_frames(exc.get("frames", []))
    fix = (f"fix {frames[-1]['file'].rsplit('/', 1)[-1]} line {frames[-1]['line']} "
           f"({frames[-1]['function']})" if frames else "fix the error below")
    return CheckResult("runs", title, "fail", f"{name} crashed {where}: {exc['type']}: "
                       f"{short(exc['message'])}", fix + "; in the cloud this would have "
                       "failed after paying for everything before it", format_frames(exc))


def _where(record: dict[str, Any]) -> str:
    steps, pending = record.get("steps", []), record.get("pending_batch")
    if pending is not None:
        last = " (the epoch's last batch)" if pending.get("last_of_epoch") else ""
        return f"at step {pending['step']}, epoch {pending['epoch'] + 1}{last}"
    if not steps:
        return "before the first step"
    last = steps[-1]
    done = len(record.get("epochs", []))
    if is_iteration_loop(record):
        return f"after step {last['step']} (in the code between steps, or after the loop)"
    if done <= last["epoch"]:  # the epoch's steps were done, the epoch never ended
        return (f"after epoch {last['epoch'] + 1}'s training steps (step {last['step']}): in "
                "evaluation or epoch-end code")
    return f"after step {last['step']}"


# losses are finite ----------------------------------------------------------------------------
def check_finite(result: PreflightResult) -> CheckResult:
    title = "losses are finite"
    smoke = result.phases["smoke"]
    record = smoke.record
    if record is None or not record["steps"]:
        return skip("finite", title, "no step ran")
    bad_data = record["scan"]["nonfinite"]
    steps = record["steps"]
    first_bad = next((s for s in steps if s["loss"] is not None and not math.isfinite(s["loss"])),
                     None)
    if first_bad is not None:
        finite = [s["loss"] for s in steps if s["loss"] is not None and math.isfinite(s["loss"])
                  and s["step"] < first_bad["step"]]
        before = f" (last finite {finite[-1]:.4g})" if finite else ""
        return CheckResult("finite", title, "fail", f"loss is {first_bad['loss']} at step "
                           f"{first_bad['step']} (epoch {first_bad['epoch'] + 1}, batch "
                           f"{first_bad['index'] + 1}){before}" + _data_note(bad_data),
                           _finite_fix(bad_data))
    if bad_data:
        return CheckResult("finite", title, "fail", "the training data holds non-finite values"
                           + _data_note(bad_data) + ": a loss computed on them is NaN",
                           _finite_fix(bad_data))
    if all(s["loss"] is None for s in steps):
        return CheckResult("finite", title, "warn", "no loss was seen", "pass the loss to "
                           "run.backward(loss) or run.step(loss=loss)")
    scan = record["scan"]
    read = "the whole first epoch's data read" if scan["complete"] else (
        f"{scan['batches']} more batches read before the {scan['seconds']:.0f} s scan budget")
    if not record["batches"]:
        read = "the loop draws its own batches (no run.batches): no data to read ahead"
    return CheckResult("finite", title, "pass", f"{len(steps)} finite losses; {read}, no NaN/inf")


def _data_note(bad: list[dict[str, Any]]) -> str:
    if not bad:
        return ""
    first = bad[0]
    rows = ", ".join(str(r) for r in first["rows"]) or "?"
    how = "trained on" if first["trained"] else "found by the data scan"
    return (f"; {first['path']} holds NaN/inf in batch {first['index'] + 1} of epoch "
            f"{first['epoch'] + 1}, sample(s) {rows} of that batch ({how})")


def _finite_fix(bad: list[dict[str, Any]]) -> str:
    if bad:
        return ("clean or drop the bad sample(s): check torch.isfinite(x).all() when building the "
                "dataset; one bad sample makes the whole model NaN")
    return ("look for log(0), division by zero or overflow in the loss; lower the learning rate; "
            "`prudent run --debug` turns on anomaly detection")


# gradients ------------------------------------------------------------------------------------
def check_gradients(result: PreflightResult) -> CheckResult:
    title = "gradients reach every parameter"
    record = result.phases["smoke"].record
    if record is None or not record["steps"]:
        return skip("gradients", title, "no step ran")
    grads = record["gradients"]
    if not grads.get("watched"):
        return skip("gradients", title, "no nn.Module attached: run.attach(model=model)")
    if grads["never"]:
        return CheckResult("gradients", title, "fail", f"{len(grads['never'])} of "
                           f"{grads['num_trainable']} trainable parameters never got a (non-zero) "
                           f"gradient in {len(record['steps'])} steps: {_names(grads['never'])}",
                           "these layers do not learn: look for torch.no_grad(), .detach() or "
                           ".item() on their output, or a layer that is built but never used; if "
                           "they are meant to be frozen, set requires_grad=False")
    if grads["not_in_optimizer"]:
        return CheckResult("gradients", title, "fail", f"{len(grads['not_in_optimizer'])} "
                           "parameters get gradients but are in no attached optimizer: "
                           f"{_names(grads['not_in_optimizer'])}", "build the optimizer from "
                           "model.parameters() after every layer exists")
    if grads["frozen"]:  # requires_grad=False is set by the script: a frozen backbone, not a bug
        return CheckResult("gradients", title, "pass", f"all {grads['num_trainable']} trainable "
                           f"parameters got gradients; {len(grads['frozen'])} frozen by the "
                           f"script (requires_grad=False): {_names(grads['frozen'])}")
    return CheckResult("gradients", title, "pass", f"all {grads['num_trainable']} parameters "
                       "got gradients")


def _names(names: list[str], limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


# overfits one batch ---------------------------------------------------------------------------
def check_overfit(result: PreflightResult) -> CheckResult:
    title = "overfits one batch"
    phase, smoke = result.phases.get("overfit"), result.phases["smoke"]
    if phase is None or phase.record is None:
        return skip("overfit", title, "the script did not reach prudent.init()")
    losses = [s["loss"] for s in phase.record["steps"]]
    if phase.record["status"] == "failed" or not losses:
        if smoke.status == "failed":
            return skip("overfit", title, "blocked by the crash reported above")
        return CheckResult("overfit", title, "fail", f"the overfit run crashed: "
                           f"{exception_of(phase)['type']}", "fix the error below",
                           format_frames(exception_of(phase)))
    if any(v is None for v in losses):
        return CheckResult("overfit", title, "warn", "no loss was seen", "pass the loss to "
                           "run.backward(loss) or run.step(loss=loss)")
    what = "one repeated batch"
    if _drew_its_own(phase.record):
        why_not, losses = _replayed(phase.record, losses)
        if why_not:
            return skip("overfit", title, why_not)
        what = "the first step's batches, drawn again every step (generators rewound)"
    judged = _judge_overfit(title, losses, what)
    stale = stale_parameters(result)
    if stale:
        judged.status, judged.fix = "fail", _STALE_FIX
        judged.summary += (f"; gradients pile up: after optimizer.step() a new backward added onto "
                           f"the old gradients of {_names(stale, 4)}")
    return judged


SHORT_OVERFIT = 100  # fewer overfit steps than this (a short run): halving the loss passes
_COMPARED_STEPS = 6  # the overfit run's first steps: the same inputs if a batch was repeated
_STALE_FIX = ("call optimizer.zero_grad() once per step (before backward or after step); "
              "without it every step also applies all the previous gradients")


def _drew_its_own(record: dict[str, Any]) -> bool:
    """The overfit run never went through run.batches: the probe rewound the generators."""
    return bool(record.get("rewound")) and not record.get("loader_repeated")


def _replayed(record: dict[str, Any], losses: list[float]) -> tuple[str, list[float]]:
    """Whether rewinding the generators repeated the batches (a reason if not), and the losses
    to judge: those of the repeated steps (step 0 may have drawn before anything was rewound,
    and step 1 too where the batch is prefetched across the step).
    """
    inputs = [s.get("inputs") for s in record["steps"][:_COMPARED_STEPS]]
    own = "the loop draws its own batches (no run.batches)"
    if len(inputs) < 3 or None in inputs:
        return (f"{own} and the attached model was fed too few steps to tell whether rewinding "
                "the random generators repeated them: cannot repeat one", [])
    # a batch prefetched across the step (nanoGPT's, carried with run.carry) was drawn before
    # the first rewind too: the repeats then begin a step later
    first = 1 if len(set(inputs[1:])) == 1 else 2
    if len(inputs) - first < 2 or len(set(inputs[first:])) != 1:
        return (f"{own}, and the model got other inputs every step although prudent rewound "
                "Python's, NumPy's and torch's generators to repeat one: the batch is drawn "
                "before the step that trains on it (a prefetch: carry it with run.carry) or "
                "comes from a source prudent cannot rewind (a generator of the script's own: "
                "attach it; an iterator over a file)", [])
    if first == 2:
        return "", losses[2:]
    return "", losses if inputs[0] == inputs[1] else losses[1:]


def _judge_overfit(title: str, losses: list[float],
                   what: str = "one repeated batch") -> CheckResult:
    first, n = losses[0], len(losses)
    if not all(math.isfinite(v) for v in losses):
        at = next(i for i, v in enumerate(losses) if not math.isfinite(v)) + 1
        return CheckResult("overfit", title, "fail", f"on {what} the loss became "
                           f"non-finite at step {at} (from {first:.4g})", "lower the learning "
                           "rate, or look for an unstable loss")
    end = min(losses[-5:])
    seen = f"loss {first:.4g} -> {end:.4g} in {n} steps on {what}"
    if abs(first) < 1e-6 or end <= first / OVERFIT_FACTOR:
        return CheckResult("overfit", title, "pass", f"{seen} ({_ratio(first, end)})")
    if n < SHORT_OVERFIT and end <= first / 2:
        # the script's own run is shorter than the overfit test wants (run.steps(60)): a loss
        # that halved is learning; 10x is what a few hundred steps on one batch reach
        return CheckResult("overfit", title, "pass", f"{seen} ({_ratio(first, end)}; only "
                           f"{n} steps, the run's own length: {OVERFIT_FACTOR:g}x is expected "
                           f"of {SHORT_OVERFIT} or more)")
    fix = ("a model that cannot memorise one batch will not learn the data: look for a missing "
           "optimizer.zero_grad() (gradients pile up), a detached graph, a loss computed on the "
           "wrong tensors, or a learning rate that is 0 (or warms up for longer than "
           f"{n} steps)")
    status = "warn" if end <= first / 2 else "fail"
    return CheckResult("overfit", title, status, f"{seen}: fell only {_ratio(first, end)}, "
                       f"expected at least {OVERFIT_FACTOR:g}x", fix)


def _ratio(first: float, end: float) -> str:
    """The fall as a factor, rounded down: 9.97x is "9.9x", never "10.0x" beside "expected at
    least 10x"."""
    return f"{math.floor(first / end * 10) / 10:.1f}x" if end > 0 else "to 0"


CHECKS = [check_runs, check_finite, check_gradients, check_overfit, check_batches, check_resume]
