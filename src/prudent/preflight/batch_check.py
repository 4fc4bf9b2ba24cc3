"""The batch check: every batch, and what the model was fed, has the first batch's structure.

A dtype that differs, a key that appears, a last batch smaller than the others breaks a run
hours in; a loop without ``run.batches`` is judged on what the attached model was fed.
"""

from __future__ import annotations

import re
from typing import Any

from prudent.preflight import structure
from prudent.preflight.result import CheckResult, exception_of, short, skip, title_of
from prudent.preflight.runner import PhaseResult, PreflightResult
from prudent.preflight.tracebacks import format_frames

__all__ = ["check_batches"]

_DTYPE_ERROR = re.compile(r"dtype|scalar type|expected .*(Float|Double|Half|Long|Int)|"
                          r"found (Float|Double|Half|Long|Int)", re.IGNORECASE)


def check_batches(result: PreflightResult) -> CheckResult:
    title = "batch shapes and dtypes are consistent"
    smoke = result.phases["smoke"]
    record = smoke.record
    if record is None:
        return skip("batches", title, "the script did not reach prudent.init()")
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
            exception_of(smoke)["message"]):
        problems.append(f"the run crashed on a dtype mismatch: {exception_of(smoke)['message']}")
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
    exc = exception_of(smoke)
    return CheckResult("batches", title_of("batches"), "fail",
                       f"the run crashed on {which} ({size} samples, the others {usual}): "
                       f"{exc['type']}: {short(exc['message'])}",
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
        return skip("batches", title, "no batch was loaded through run.batches() and no "
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
