from __future__ import annotations

import json

from prudent.preflight.checks import CheckResult
from prudent.preflight.projection import Price, project
from prudent.preflight.report import as_json, as_text, projection_check, verdict_ok
from prudent.preflight.runner import PhaseResult, PreflightResult

RECORD = {"step_s": 0.005, "num_epochs": 10, "batches_per_epoch": 45, "steps": [{}] * 16,
          "epochs": [{"epoch": 1, "tail_s": 0.03}], "memory": {"peak_rss_bytes": 400 * 2**20}}


def result() -> PreflightResult:
    out = PreflightResult(["python", "train.py"], steps=8, seconds=12.5)
    out.phases["smoke"] = PhaseResult("smoke", 0, 5.0, RECORD)
    return out


def test_the_projection_line_states_the_arithmetic_and_the_price() -> None:
    projection = project(RECORD, speedup=None, price=Price(1.0, "aws:g5.xlarge on demand"),
                         device="cpu")
    check = projection_check(result(), projection)
    assert check.status == "pass"
    assert "10 epochs x 45 batches x 5.0 ms + 0.03 s evaluation per epoch = 3 s" in check.summary
    assert "under $0.01 at $1/h" in check.summary
    assert "assumes: no speedup applied" in check.detail


def test_text_and_json_say_what_failed_and_exit_accordingly() -> None:
    checks = [CheckResult("runs", "runs end to end", "pass", "16 steps"),
              CheckResult("overfit", "overfits one batch", "fail", "loss 2.3 -> 2.2",
                          "add optimizer.zero_grad()")]
    text = as_text(result(), checks)
    assert "  FAIL  overfits one batch: loss 2.3 -> 2.2" in text
    assert "fix: add optimizer.zero_grad()" in text
    assert text.endswith("train.py is not ready for the cloud: 1 check(s) failed (overfit)")
    document = json.loads(as_json(result(), checks, None))
    assert document["ok"] is False and not verdict_ok(checks)
    assert [c["status"] for c in document["checks"]] == ["pass", "fail"]
    assert document["processes"]["smoke"]["exit_code"] == 0


def test_an_iteration_loop_is_projected_and_headed_in_steps() -> None:
    loop = {"step_s": 0.016, "num_epochs": None, "batches_per_epoch": None, "num_steps": 200,
            "epochs": [], "steps": [{}] * 16, "memory": {}}
    out = PreflightResult(["python", "nanogpt.py"], steps=8, seconds=14.0)
    out.phases["smoke"] = PhaseResult("smoke", 0, 5.0, loop)
    check = projection_check(out, project(loop, speedup=None, price=None, device="cpu"))
    assert check.status == "pass" and "full run: 200 steps x 16.0 ms = 3 s" in check.summary
    assert as_text(out, [check]).startswith("preflight of python nanogpt.py (16 of 200 steps, ")
    assert "epoch" not in check.summary


def test_a_frameworks_step_plan_is_shown_as_optimizer_steps_plus_evaluation() -> None:
    record = {"step_s": 0.02, "num_epochs": 3, "batches_per_epoch": 400, "num_steps": 300,
              "epochs": [{"epoch": 0, "tail_s": 1.5}], "steps": [{}] * 16, "memory": {}}
    out = PreflightResult(["python", "train_lightning.py"], steps=8, seconds=14.0)
    out.phases["smoke"] = PhaseResult("smoke", 0, 5.0, record)
    check = projection_check(out, project(record, speedup=None, price=None, device="cpu"))
    assert check.status == "pass"
    assert "full run: 300 optimizer steps x 20.0 ms + 3 epochs x 1.50 s evaluation = 10 s" \
        in check.summary, check.summary
