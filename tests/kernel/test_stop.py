"""StopReason: the documented stop_reason strings, their exit codes, and the facts code reads."""

from __future__ import annotations

import pytest

from prudent.kernel.errors import StopRun, exit_code_for
from prudent.kernel.stop import ExitCode, StopKind, StopReason

DOCUMENTED = {"preempted": 75, "budget": 4, "pruned": 5, "policy": 6, "interrupted": 130,
              "error": 1, "rule:non_finite": 3, "rule:loss_not_decreasing": 3}


@pytest.mark.parametrize(("text", "code"), sorted(DOCUMENTED.items()))
def test_each_documented_reason_keeps_its_string_and_exit_code(text: str, code: int) -> None:
    reason = StopReason.parse(text, "why")
    assert str(reason) == text and reason.exit_code == code == exit_code_for(text)
    assert StopRun(text, "why").stop == reason


def test_a_rule_is_a_field_not_a_prefix_to_cut() -> None:
    reason = StopReason.parse("rule:loss_not_decreasing")
    assert reason.kind is StopKind.RULE and reason.rule == "loss_not_decreasing"
    pruned = StopReason.pruned("rule overfitting: val_loss rose", rule="overfitting")
    assert str(pruned) == "pruned" and pruned.rule == "overfitting" and pruned.ends_early
    assert StopReason.pruned("pruner: not among the best").rule is None


def test_a_rule_stop_needs_its_rule_and_other_kinds_take_none() -> None:
    with pytest.raises(ValueError, match="names the rule"):
        StopReason(StopKind.RULE)
    with pytest.raises(ValueError, match="names no rule"):
        StopReason(StopKind.BUDGET, "non_finite")


def test_only_a_preemption_resumes_by_relaunching_and_an_unknown_word_is_an_error() -> None:
    assert [k.value for k in StopKind if StopReason(k, "r" if k is StopKind.RULE else None)
            .resumable] == ["preempted"]
    assert StopReason.parse("gremlins").kind is StopKind.ERROR


@pytest.mark.parametrize("code", [0, 1, 3, 4, 5, 6, 75, 130, 9])
def test_a_supervisor_reads_the_reason_back_from_an_exit_code(code: int) -> None:
    reason = StopReason.from_exit_code(code)
    if code == ExitCode.COMPLETED:
        assert reason is None
    else:
        assert reason is not None and (reason.exit_code == code or reason.kind is StopKind.ERROR)
