"""The checklist judged from recorded data (what the probe writes), without processes."""

from __future__ import annotations

import copy
from typing import Any

from prudent.preflight.checks import (
    check_batches,
    check_finite,
    check_gradients,
    check_overfit,
    check_resume,
    check_runs,
)
from prudent.preflight.runner import PhaseResult, PreflightResult

SIG = [["batch[0]", [4, 3], "float32"], ["batch[1]", [4], "int64"]]


def record(num_steps: int = 8, **changes: Any) -> dict[str, Any]:
    steps = [{"step": i + 1, "epoch": i // 4, "index": i % 4, "loss": 2.0 - 0.1 * i,
              "time_s": 0.01} for i in range(num_steps)]
    base = {"status": "completed", "stop_reason": None, "steps": steps, "final_step": num_steps,
            "num_epochs": 2, "batches_per_epoch": 4, "num_steps": None,
            "epochs": [{"epoch": 0, "tail_s": 0.1}, {"epoch": 1, "tail_s": 0.1}],
            "batches": [{"leaves": SIG, "count": num_steps, "first_step": 1, "epoch": 0,
                         "index": 0, "trained": True, "last_of_epoch": False}],
            "pending_batch": None, "model_inputs": {}, "exception": None,
            "scan": {"batches": 3, "complete": True, "seconds": 0.1, "nonfinite": []},
            "gradients": {"num_params": 2, "num_trainable": 2, "never": [], "frozen": [],
                          "not_in_optimizer": [], "stale": [], "watched": True}}
    base.update(copy.deepcopy(changes))
    return base


def result(smoke: dict[str, Any] | None, rc: int = 0, stderr: str = "",
           **phases: dict[str, Any]) -> PreflightResult:
    out = PreflightResult(["python", "train.py"], steps=4, stop_at=6)
    out.phases["smoke"] = PhaseResult("smoke", rc, 1.0, smoke, stderr=stderr)
    for name, rec in phases.items():
        out.phases[name] = PhaseResult(name, 0, 1.0, rec)
    return out


def test_a_script_that_never_calls_init_is_told_so_plainly() -> None:
    check = check_runs(result(None))
    assert check.status == "fail"
    assert "train.py never called prudent.init()" in check.summary
    assert "prudent.init(" in check.fix


def test_a_crash_before_init_shows_the_traceback() -> None:
    stderr = ('Traceback (most recent call last):\n  File "/u/train.py", line 3, in <module>\n'
              "    import missing\nModuleNotFoundError: No module named 'missing'\n")
    check = check_runs(result(None, rc=1, stderr=stderr))
    assert check.status == "fail" and "crashed before prudent.init()" in check.summary
    assert "/u/train.py" in check.detail


def test_a_crash_after_the_last_step_of_an_epoch_is_placed_in_evaluation() -> None:
    exc = {"type": "NameError", "message": "name 'x' is not defined",
           "frames": [{"file": "/u/train.py", "line": 9, "function": "<module>", "code": "x"}]}
    crashed = record(4, status="failed", exception=exc, epochs=[])
    check = check_runs(result(crashed))
    assert check.status == "fail" and "in evaluation or epoch-end code" in check.summary
    assert "train.py line 9" in check.fix


def test_the_first_non_finite_loss_is_named_with_the_bad_sample() -> None:
    rec = record()
    rec["steps"][4]["loss"] = float("nan")
    rec["scan"]["nonfinite"] = [{"epoch": 1, "index": 0, "trained": True, "path": "batch[0]",
                                 "rows": [2]}]
    check = check_finite(result(rec))
    assert check.status == "fail" and "loss is nan at step 5" in check.summary
    assert "sample(s) 2" in check.summary and "last finite 1.7" in check.summary


def test_bad_data_found_by_the_scan_fails_even_when_every_loss_was_finite() -> None:
    rec = record(scan={"batches": 3, "complete": True, "seconds": 0.1, "nonfinite": [
        {"epoch": 0, "index": 30, "trained": False, "path": "batch[0]", "rows": [7]}]})
    check = check_finite(result(rec))
    assert check.status == "fail" and "found by the data scan" in check.summary


def test_parameters_without_gradient_fail_and_frozen_ones_pass_with_their_names() -> None:
    never = record(gradients={**record()["gradients"], "never": ["encoder.weight"]})
    assert check_gradients(result(never)).status == "fail"
    assert "encoder.weight" in check_gradients(result(never)).summary
    frozen = record(gradients={**record()["gradients"], "frozen": ["embed.weight"]})
    # frozen on purpose (a fine-tuning recipe's backbone, accelerate's cv_example): no warning
    assert check_gradients(result(frozen)).status == "pass"
    assert "1 frozen by the script" in check_gradients(result(frozen)).summary
    assert check_gradients(result(record())).status == "pass"


def overfit_record(losses: list[float], stale: list[str] | None = None) -> dict[str, Any]:
    rec = record(len(losses))
    for step, loss in zip(rec["steps"], losses):
        step["loss"] = loss
    rec["gradients"]["stale"] = stale or []
    return rec


def test_overfit_passes_on_a_large_fall_and_fails_on_a_flat_loss() -> None:
    falling = [2.3 * 0.9 ** i for i in range(60)]
    assert check_overfit(result(record(), overfit=overfit_record(falling))).status == "pass"
    flat = [2.3 - 0.001 * i for i in range(60)]
    check = check_overfit(result(record(), overfit=overfit_record(flat)))
    assert check.status == "fail" and "zero_grad" in check.fix


def test_a_fall_just_short_of_the_factor_is_not_rounded_up_to_it() -> None:
    losses = [2.3] * 10 + [2.3 / 9.97] * 100  # fell 9.97x: "10.0x" beside "at least 10x" read
    check = check_overfit(result(record(), overfit=overfit_record(losses)))
    assert check.status == "warn" and "fell only 9.9x, expected at least 10x" in check.summary


def test_a_run_too_short_for_the_overfit_factor_passes_when_its_loss_halved() -> None:
    # a script's own run.steps(60) caps the overfit run at ~33 steps: a tiny language model
    # with dropout fell 5.6x there, learning, and read as a warning
    falling = [1.914 * 0.95 ** i for i in range(33)]
    check = check_overfit(result(record(), overfit=overfit_record(falling)))
    assert check.status == "pass" and "only 33 steps, the run's own length" in check.summary
    flat = [1.914 * 0.99 ** i for i in range(33)]  # fell 1.3x: still judged
    assert check_overfit(result(record(), overfit=overfit_record(flat))).status == "fail"


def test_gradients_that_pile_up_fail_overfit_and_skip_resume() -> None:
    falling = [2.3 * 0.97 ** i for i in range(60)]  # falls 5x: a warning on its own
    smoke = record(gradients={**record()["gradients"], "stale": ["0.weight"]})
    piled = result(smoke, overfit=overfit_record(falling, ["0.weight"]), stop=record(6,
                   status="stopped"), resume=record(8))
    check = check_overfit(piled)
    assert check.status == "fail" and "gradients pile up" in check.summary
    assert check_resume(piled).status == "skip"


def test_a_crash_on_the_smaller_last_batch_fails_the_batch_check() -> None:
    exc = {"type": "RuntimeError", "message": "shape '[4, 3]' is invalid", "frames": []}
    pending = {"step": 5, "epoch": 0, "index": 3, "last_of_epoch": True,
               "leaves": [["batch[0]", [2, 3], "float32"], ["batch[1]", [2], "int64"]]}
    rec = record(4, status="failed", exception=exc, pending_batch=pending)
    check = check_batches(result(rec))
    assert check.status == "fail" and "last, smaller batch (2 samples, the others 4)" in \
        check.summary


def test_evaluation_inputs_of_another_dtype_fail_the_batch_check() -> None:
    inputs = {"model": {"train": [[["input['args'][0]", [4, 3], "float32"]]],
                        "eval": [[["input['args'][0]", [9, 3], "float64"]]]}}
    check = check_batches(result(record(model_inputs=inputs)))
    assert check.status == "fail" and "float64, in training float32" in check.summary


def test_resume_passes_only_when_the_losses_after_the_restart_are_identical() -> None:
    smoke = record()
    stop = record(6, status="stopped", stop_reason="preempted")
    stop["steps"] = smoke["steps"][:6]
    resumed = record(8)
    resumed["steps"] = copy.deepcopy(smoke["steps"][6:])
    assert check_resume(result(smoke, stop=stop, resume=resumed)).status == "pass"
    resumed["steps"][1]["loss"] += 1e-7
    check = check_resume(result(smoke, stop=stop, resume=resumed))
    assert check.status == "fail" and "step 8" in check.summary


def test_a_resumed_process_that_crashes_fails_resume_with_its_traceback() -> None:
    exc = {"type": "KeyError", "message": "'best_acc'", "frames": [
        {"file": "/u/train.py", "line": 20, "function": "load_state_dict", "code": "s['best_acc']"}]}
    stop = record(6, status="stopped", stop_reason="preempted")
    crashed = record(0, status="failed", exception=exc)
    check = check_resume(result(record(), stop=stop, resume=crashed))
    assert check.status == "fail" and "KeyError" in check.summary and "/u/train.py" in check.detail


def test_nondeterministic_scripts_warn_instead_of_failing_resume() -> None:
    smoke, stop = record(), record(6, status="stopped")
    stop["steps"][0]["loss"] = 9.0
    assert check_resume(result(smoke, stop=stop, resume=record())).status == "warn"


def test_a_crash_after_the_training_block_fails_runs() -> None:
    stderr = ('Traceback (most recent call last):\n  File "/u/train.py", line 30, in <module>\n'
              "    torch.save(model, '/nonexistent/model.pt')\n"
              "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/model.pt'\n")
    check = check_runs(result(record(), rc=1, stderr=stderr))
    assert check.status == "fail" and "after the `with run:` block" in check.summary
    assert "/u/train.py" in check.detail


def iteration_record(num_steps: int = 8, **changes: Any) -> dict[str, Any]:
    """A run.steps loop that draws its own batches: no epochs, no run.batches, no data scan."""
    rec = record(num_steps, num_epochs=None, batches_per_epoch=None, epochs=[], batches=[],
                 num_logs=2, scan={"batches": 0, "complete": False, "seconds": 0.0,
                                   "nonfinite": []})
    rec["num_steps"] = 200
    for step in rec["steps"]:
        step["epoch"], step["index"] = 0, -1
    rec.update(copy.deepcopy(changes))
    return rec


def test_an_iteration_loop_is_described_in_steps_not_epochs() -> None:
    check = check_runs(result(iteration_record()))
    assert check.status == "pass" and "8 of run.steps(200)'s iterations" in check.summary
    assert "epoch" not in check.summary and "run.log called 2 time(s)" in check.summary
    finite = check_finite(result(iteration_record()))
    assert finite.status == "pass" and "draws its own batches" in finite.summary
    assert "scan budget" not in finite.summary
    exc = {"type": "NameError", "message": "name 'x' is not defined", "frames": []}
    crashed = check_runs(result(iteration_record(4, status="failed", exception=exc)))
    assert "crashed after step 4 (in the code between steps" in crashed.summary


def replayed(losses: list[float], inputs: list[str]) -> dict[str, Any]:
    rec = iteration_record(len(losses), rewound=True)
    for step, loss, fed in zip(rec["steps"], losses, inputs + [None] * len(losses)):
        step["loss"], step["inputs"] = loss, fed
    return rec


def test_overfit_judges_a_loop_that_draws_its_own_batches_only_when_they_repeated() -> None:
    falling = [2.3 * 0.9 ** i for i in range(60)]
    check = check_overfit(result(iteration_record(), overfit=replayed(falling, ["a"] * 6)))
    assert check.status == "pass" and "drawn again every step" in check.summary
    # step 0 drew before the generators were first rewound: judged from step 1 on
    check = check_overfit(result(iteration_record(),
                                 overfit=replayed([9.0] + falling, ["z"] + ["a"] * 5)))
    assert check.status == "pass" and "loss 2.3 ->" in check.summary
    # nanoGPT's prefetch carried across the step (run.carry): steps 0 and 1 trained batches
    # drawn before the first rewind; the repeats begin at step 2 (it used to SKIP, naming
    # run.carry as the fix to a script that already used it)
    check = check_overfit(result(iteration_record(), overfit=replayed(
        [9.0, 8.0] + falling, ["y", "z"] + ["a"] * 4)))
    assert check.status == "pass" and "loss 2.3 ->" in check.summary
    # a generator of the script's own: no batch repeated, so no verdict on a healthy script
    slow = [2.3 * 0.99 ** i for i in range(60)]
    check = check_overfit(result(iteration_record(), overfit=replayed(slow, list("abcdef"))))
    assert check.status == "skip" and "the loop draws its own batches (no run.batches)" in \
        check.summary and "cannot rewind" in check.summary
    # nanoGPT draws from torch's global generator, which was rewound: the skip names the
    # prefetch too, not only a generator of the script's own
    assert "drawn before the step that trains on it" in check.summary


def test_a_loop_without_run_batches_is_checked_on_what_the_model_was_fed() -> None:
    fed = {"model": {"train": [[["input['args'][0]", [16, 32], "int64"]]],
                     "eval": [[["input['args'][0]", [16, 32], "int64"]]]}}
    check = check_batches(result(iteration_record(model_inputs=fed)))
    assert check.status == "pass" and "int64 (16, 32) in training and in evaluation" in \
        check.summary
    fed["model"]["eval"] = [[["input['args'][0]", [16, 32], "int32"]]]
    assert check_batches(result(iteration_record(model_inputs=fed))).status == "fail"
    assert check_batches(result(iteration_record())).status == "skip"


def test_a_resume_that_draws_other_random_numbers_names_the_generators() -> None:
    smoke = iteration_record()
    for step in smoke["steps"]:  # Python's random unseeded: another state in every process
        step["rng"] = {"torch": f"t{step['step']}", "python": "smoke"}
        step["inputs"] = f"i{step['step']}"
    stop = iteration_record(6, status="stopped")
    stop["steps"] = copy.deepcopy(smoke["steps"][:6])
    resumed = iteration_record(8)
    resumed["steps"] = copy.deepcopy(smoke["steps"][6:])
    for step in stop["steps"] + resumed["steps"]:
        step["rng"]["python"] = "another process"
    resumed["steps"][0]["loss"] += 0.5
    check = check_resume(result(smoke, stop=stop, resume=resumed))
    assert check.status == "fail" and "generators" not in check.summary  # same generators
    resumed["steps"][1]["inputs"] = "other"  # a generator of the script's own: other batches
    check = check_resume(result(smoke, stop=stop, resume=resumed))
    assert check.status == "fail" and "at step 8 the model was fed other batches" in \
        check.summary and "generators were the same" in check.summary
    assert "np.random.default_rng of your own" in check.fix
    resumed["steps"][0]["rng"]["torch"] = "other"
    check = check_resume(result(smoke, stop=stop, resume=resumed))
    assert check.status == "fail" and "random generators (torch) already differed after step 7" \
        in check.summary
    assert "run.state.step" in check.fix and "torch.Generator" in check.fix
