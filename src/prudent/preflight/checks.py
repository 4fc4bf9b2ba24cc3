"""The checklist: what the preflight processes recorded, judged line by line.

Each check returns a :class:`CheckResult` with a status (``pass``, ``warn``, ``fail`` or
``skip``), one line saying what was seen (with the numbers), a fix when something is wrong,
and optional detail (a trimmed traceback, parameter names). A check that depends on a process
that crashed for a reason another check already reports says ``skip``, so one bug fails the
check that names it rather than every check downstream of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from prudent.preflight import structure
from prudent.preflight.probe import OVERFIT_FACTOR
from prudent.preflight.runner import PhaseResult, PreflightResult
from prudent.preflight.tracebacks import format_frames, parse_stderr, user_frames

__all__ = ["CHECKS", "CheckResult", "run_checks", "script_name"]

_DTYPE_ERROR = re.compile(r"dtype|scalar type|expected .*(Float|Double|Half|Long|Int)|"
                          r"found (Float|Double|Half|Long|Int)", re.IGNORECASE)


@dataclass
class CheckResult:
    id: str
    title: str
    status: str  # pass | warn | fail | skip
    summary: str
    fix: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def script_name(command: list[str]) -> str:
    scripts = [a for a in command if a.endswith(".py")]
    return scripts[0].rsplit("/", 1)[-1] if scripts else command[0]


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
    if record["status"] == "stopped":
        return CheckResult("runs", title, "warn", f"stopped early ({record['stop_reason']}) at "
                           f"step {record['final_step']}: the rest of the loop was not exercised",
                           "see the other checks; a stop by a budget or policy comes from your "
                           "prudent.yaml")
    if smoke.returncode != 0 and record["status"] == "completed":
        exc = parse_stderr(smoke.stderr) or _exception(smoke)
        return CheckResult("runs", title, "fail", f"training completed, then {name} crashed "
                           f"after the `with run:` block: {exc['type']}: {_short(exc['message'])}",
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


def _crashed(title: str, phase: PhaseResult, name: str) -> CheckResult:
    exc = _exception(phase)
    record = phase.record or {}
    where = _where(record)
    frames = user_frames(exc.get("frames", []))
    fix = (f"fix {frames[-1]['file'].rsplit('/', 1)[-1]} line {frames[-1]['line']} "
           f"({frames[-1]['function']})" if frames else "fix the error below")
    return CheckResult("runs", title, "fail", f"{name} crashed {where}: {exc['type']}: "
                       f"{_short(exc['message'])}", fix + "; in the cloud this would have "
                       "failed after paying for everything before it", format_frames(exc))


def _exception(phase: PhaseResult) -> dict[str, Any]:
    record = phase.record or {}
    return (record.get("exception") or parse_stderr(phase.stderr)
            or {"type": "Error", "message": f"exit code {phase.returncode}", "frames": []})


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
        return _skip("finite", title, "no step ran")
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
        return _skip("gradients", title, "no step ran")
    grads = record["gradients"]
    if not grads.get("watched"):
        return _skip("gradients", title, "no nn.Module attached: run.attach(model=model)")
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
    if grads["frozen"]:
        return CheckResult("gradients", title, "warn", f"all {grads['num_trainable']} trainable "
                           f"parameters get gradients; {len(grads['frozen'])} are frozen "
                           f"(requires_grad=False): {_names(grads['frozen'])}",
                           "if freezing them was not intended, set requires_grad=True")
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
        return _skip("overfit", title, "the script did not reach prudent.init()")
    losses = [s["loss"] for s in phase.record["steps"]]
    if phase.record["status"] == "failed" or not losses:
        if smoke.status == "failed":
            return _skip("overfit", title, "blocked by the crash reported above")
        return CheckResult("overfit", title, "fail", f"the overfit run crashed: "
                           f"{_exception(phase)['type']}", "fix the error below",
                           format_frames(_exception(phase)))
    if any(v is None for v in losses):
        return CheckResult("overfit", title, "warn", "no loss was seen", "pass the loss to "
                           "run.backward(loss) or run.step(loss=loss)")
    what = "one repeated batch"
    if _drew_its_own(phase.record):
        why_not, losses = _replayed(phase.record, losses)
        if why_not:
            return _skip("overfit", title, why_not)
        what = "the first step's batches, drawn again every step (generators rewound)"
    judged = _judge_overfit(title, losses, what)
    stale = _stale(result)
    if stale:
        judged.status, judged.fix = "fail", _STALE_FIX
        judged.summary += (f"; gradients pile up: after optimizer.step() a new backward added onto "
                           f"the old gradients of {_names(stale, 4)}")
    return judged


_STALE_FIX = ("call optimizer.zero_grad() once per step (before backward or after step); "
              "without it every step also applies all the previous gradients")


def _drew_its_own(record: dict[str, Any]) -> bool:
    """The overfit run never went through run.batches: the probe rewound the generators."""
    return "replay" in record and not record.get("loader_repeated")


def _replayed(record: dict[str, Any], losses: list[float]) -> tuple[str, list[float]]:
    """Whether rewinding the generators repeated the batches (a reason if not), and the losses
    to judge: those of the repeated steps (step 0 may have drawn before anything was rewound).
    """
    inputs = record["replay"]["inputs"]
    own = "the loop draws its own batches (no run.batches)"
    if len(inputs) < 3:
        return (f"{own} and the attached model was fed too few steps to tell whether rewinding "
                "the random generators repeated them: cannot repeat one", [])
    if len(set(inputs[1:])) != 1:
        return (f"{own} from a source prudent cannot rewind (not Python's, NumPy's or torch's "
                "global generators): the model got other inputs every step, so no batch could "
                "be repeated", [])
    return "", losses if inputs[0] == inputs[1] else losses[1:]


def _stale(result: PreflightResult) -> list[str]:
    records = [p.record for p in result.phases.values() if p.record is not None]
    return sorted({n for r in records for n in r.get("gradients", {}).get("stale", [])})


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
    fix = ("a model that cannot memorise one batch will not learn the data: look for a missing "
           "optimizer.zero_grad() (gradients pile up), a detached graph, a loss computed on the "
           "wrong tensors, or a learning rate that is 0 (or warms up for longer than "
           f"{n} steps)")
    status = "warn" if end <= first / 2 else "fail"
    return CheckResult("overfit", title, status, f"{seen}: fell only {_ratio(first, end)}, "
                       f"expected at least {OVERFIT_FACTOR:g}x", fix)


def _ratio(first: float, end: float) -> str:
    return f"{first / end:.1f}x" if end > 0 else "to 0"


# batch shapes and dtypes ----------------------------------------------------------------------
def check_batches(result: PreflightResult) -> CheckResult:
    title = "batch shapes and dtypes are consistent"
    smoke = result.phases["smoke"]
    record = smoke.record
    if record is None:
        return _skip("batches", title, "the script did not reach prudent.init()")
    seen = record["batches"]
    if not seen:
        return _model_inputs_only(title, record)
    reference = seen[0]["leaves"]
    crash = _batch_crash(record, smoke, reference)
    if crash is not None:
        return crash
    problems, notes = _compare_batches(seen, reference)
    problems += _model_inputs(record.get("model_inputs", {}))
    if not problems and record["status"] == "failed" and _DTYPE_ERROR.search(
            _exception(smoke)["message"]):
        problems.append(f"the run crashed on a dtype mismatch: {_exception(smoke)['message']}")
    if problems:
        return CheckResult("batches", title, "fail", "; ".join(problems[:4]), "make every batch "
                           "(training and validation) the same dtypes as the first: convert "
                           "once when building the dataset (x.float(), y.long())")
    size = structure.batch_size(reference)
    return CheckResult("batches", title, "pass", f"{sum(e['count'] for e in seen)} batches "
                       f"like the first ({structure.describe(reference)})"
                       + (f"; {'; '.join(notes)}" if notes else "") + f" [batch size {size}]")


def _batch_crash(record: dict[str, Any], smoke: PhaseResult,
                 reference: list[structure.Leaf]) -> CheckResult | None:
    """The run crashed on a batch whose size differs from the first one's."""
    pending = record.get("pending_batch")
    if record["status"] != "failed" or pending is None:
        return None
    size, usual = structure.batch_size(pending["leaves"]), structure.batch_size(reference)
    if size == usual or pending["leaves"] == reference:
        return None
    which = "the epoch's last, smaller batch" if pending.get("last_of_epoch") else "a batch"
    exc = _exception(smoke)
    return CheckResult("batches", title_of("batches"), "fail",
                       f"the run crashed on {which} ({size} samples, the others {usual}): "
                       f"{exc['type']}: {_short(exc['message'])}",
                       "code assumes a fixed batch size (e.g. view(BATCH_SIZE, ...)): use "
                       "x.shape[0] or -1, or DataLoader(..., drop_last=True)", format_frames(exc))


def _compare_batches(seen: list[dict[str, Any]],
                     reference: list[structure.Leaf]) -> tuple[list[str], list[str]]:
    problems, notes = [], []
    usual = structure.batch_size(reference)
    for entry in seen[1:]:
        where = f"batch {entry['index'] + 1} of epoch {entry['epoch'] + 1}"
        differences = structure.compare(reference, entry["leaves"])
        if differences:
            problems.append(f"{where}: {', '.join(differences)}")
        elif entry.get("last_of_epoch"):
            notes.append(f"the last batch has {structure.batch_size(entry['leaves'])} samples "
                         f"(the others {usual}) and trained fine")
    return problems, notes


def _model_inputs_only(title: str, record: dict[str, Any]) -> CheckResult:
    """A loop without run.batches: judge what the attached model was fed instead."""
    inputs = record.get("model_inputs", {})
    trained = [(key, modes["train"]) for key, modes in inputs.items() if modes.get("train")]
    if not trained:
        return _skip("batches", title, "no batch was loaded through run.batches() and no "
                     "attached model was fed in training: nothing to compare")
    problems = _model_inputs(inputs)
    if problems:
        return CheckResult("batches", title, "fail", "; ".join(problems[:4]), "make the "
                           "validation batches the same dtypes as the training ones")
    key, signatures = trained[0]
    evaluated = " and in evaluation" if inputs[key].get("eval") else ""
    varied = (f"; {len(signatures)} input structures in training" if len(signatures) > 1
              else "")
    return CheckResult("batches", title, "pass", "the loop draws its own batches (no "
                       f"run.batches): {key} was fed {structure.describe(signatures[0])} in "
                       f"training{evaluated}, the same dtypes{varied}")


def _model_inputs(inputs: dict[str, dict[str, list[Any]]]) -> list[str]:
    """The model fed other dtypes in evaluation than in training."""
    problems = []
    for key, modes in inputs.items():
        train, evaluation = modes.get("train", []), modes.get("eval", [])
        if not train or not evaluation:
            continue
        for leaves in evaluation:
            dtypes = _dtype_changes(train[0], leaves)
            if dtypes:
                problems.append(f"in evaluation (model.eval()) {key} got {dtypes}: the "
                                "validation data has another dtype than the training data")
    return problems


def _dtype_changes(train: list[Any], evaluation: list[Any]) -> str:
    ref = {tuple(p) if isinstance(p, list) else p: t for p, _, t in train}
    return ", ".join(f"{p} as {t}, in training {ref[p]}" for p, _, t in evaluation
                     if p in ref and ref[p] != t)


# checkpoint round trip and exact resume -------------------------------------------------------
def check_resume(result: PreflightResult) -> CheckResult:
    title = "checkpoint round trip and exact resume"
    stop, resume = result.phases.get("stop"), result.phases.get("resume")
    if stop is None:
        return _skip("resume", title, "blocked: the smoke run did not complete"
                     if result.phases["smoke"].record else "the script never ran")
    if stop.status != "stopped":
        return CheckResult("resume", title, "fail", f"the run to be interrupted at step "
                           f"{result.stop_at} did not stop cleanly ({stop.status or 'no record'}, "
                           f"exit code {stop.returncode})", "see the error below",
                           format_frames(_exception(stop)))
    if resume is None or resume.record is None or resume.status == "failed":
        return _resume_crashed(title, result, resume)
    if _stale(result):
        return _skip("resume", title, "gradients carry over from step to step (see 'overfits "
                     "one batch'): they are not in a checkpoint, so no resume can be exact")
    if any(not _finite(v) for v in result.phases["smoke"].losses.values()):
        return _skip("resume", title, "blocked by the non-finite losses reported above")
    return _compare_resumed(title, result, stop, resume)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _same(a: float | None, b: float | None) -> bool:
    """Bit-for-bit equal losses (two NaNs count as equal: the same computation gave both)."""
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _resume_crashed(title: str, result: PreflightResult, resume: PhaseResult | None) -> CheckResult:
    exc = _exception(resume) if resume is not None else {"type": "Error", "message": "not run",
                                                         "frames": []}
    return CheckResult("resume", title, "fail", f"stopped at step {result.stop_at} with a "
                       f"checkpoint; the process that resumed from it crashed: {exc['type']}: "
                       f"{_short(exc['message'])}", "the checkpoint cannot be restored: its "
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


def _skip(check_id: str, title: str, why: str) -> CheckResult:
    return CheckResult(check_id, title, "skip", why)


def _short(message: str, limit: int = 200) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= limit else first[:limit] + "..."


_TITLES = {"batches": "batch shapes and dtypes are consistent",
           "cost": "step time, peak memory, projected time and cost"}


def title_of(check_id: str) -> str:
    return _TITLES[check_id]


CHECKS = [check_runs, check_finite, check_gradients, check_overfit, check_batches, check_resume]
