"""Failure capture and replay, end to end: a NaN from one bad sample, captured in a supervised
run and reproduced by ``prudent replay`` in the unchanged script."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Project, script

SCRIPT = script("replay_nan_sample.py")
NanRun = tuple[Project, Path, str]
BAD_SAMPLE = 1234


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> NanRun:
    """One run that hits the bad sample (checkpoints every 20 steps, for --step replays); it
    also captures a healthy step 7 on purpose (``run.capture``), for a finite replay."""
    project = Project(tmp_path_factory.mktemp("nan-run"))
    project.env["PRUDENT_CHECKPOINT_EVERY"] = "20steps"
    result = project.prudent("run", "--run-id", "nan-run", "--", sys.executable, SCRIPT,
                             "--capture-at", "7")
    assert result.returncode == 3, result.stderr  # the non_finite rule stopped it
    healthy, bundle = sorted((project.path / ".prudent/runs/nan-run/captures").iterdir(),
                             key=lambda p: int(p.name.removeprefix("step-")))
    assert healthy.name == "step-7"
    return project, bundle, result.stderr


def test_nan_from_a_bad_sample_writes_one_bundle_naming_step_and_sample(nan_run: NanRun) -> None:
    project, bundle, stderr = nan_run
    info = json.loads((bundle / "info.json").read_text())
    assert bundle.name == f"step-{info['step']}" and info["reason"] == "non_finite"
    assert info["state_when"] == "before_update" and info["loss"] == "nan"
    assert [o["sample_index"] for o in info["offending"]] == [BAD_SAMPLE]
    assert info["git"] is None or len(info["git"]["commit"]) == 40
    line = next(line for line in stderr.splitlines() if "capture: loss is nan" in line)
    assert f"at step {info['step']}" in line and f"sample {BAD_SAMPLE} of the dataset" in line
    assert f"bundle .prudent/runs/nan-run/captures/{bundle.name}" in line
    assert "reproduce it: prudent replay .prudent/runs/nan-run/captures/" in stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert {"batch.pt", "run.pt", "object-model.pt", "object-optimizer.pt", "info.json"} == set(
        manifest["files"])
    events = [e for e in project.show("nan-run")["events"] if e["kind"] == "capture"]
    assert [e["name"] for e in events] == ["written", "written"]  # step 7 on purpose, the NaN


def test_replay_reproduces_the_nan_bit_for_bit_and_names_step_and_sample(nan_run: NanRun) -> None:
    project, bundle, _ = nan_run
    step = int(bundle.name.removeprefix("step-"))
    result = project.prudent("replay", str(bundle), "--json", "--", sys.executable, SCRIPT)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["step"] == step and report["reproduced"] and report["bit_identical"]
    assert report["loss"] == "nan" and report["captured_loss"] == "nan" and report["non_finite"]
    assert [o["sample_index"] for o in report["offending"]] == [BAD_SAMPLE]
    assert report["first_non_finite"]["module"] == "0"  # the first Linear layer
    assert f"prudent replay | step {step} | loss nan (not finite)" in result.stderr
    assert f"offending sample index {BAD_SAMPLE}; REPRODUCED" in result.stderr


def test_replay_of_a_healthy_step_gives_the_identical_finite_loss(nan_run: NanRun) -> None:
    project, bundle, _ = nan_run
    healthy = bundle.parent / "step-7"
    result = project.prudent("replay", str(healthy), "--", sys.executable, SCRIPT)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "bit-identical" in result.stdout and "verdict: REPRODUCED" in result.stdout
    (line,) = [line for line in result.stdout.splitlines() if "replayed loss" in line]
    assert "not finite" not in line  # a real number, equal to the bit: dropout's mask came back


def test_replay_into_a_different_model_names_missing_and_unexpected_keys(nan_run: NanRun) -> None:
    project, bundle, _ = nan_run
    result = project.prudent("replay", str(bundle), "--", sys.executable, SCRIPT, "--other-model")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("prudent: error:")]
    assert "cannot restore 'model'" in line
    assert "missing keys (in the model, not in the bundle): 2.weight, 2.bias" in line
    assert "unexpected keys (in the bundle, not in the model): 3.weight, 3.bias" in line
    assert "Traceback" not in result.stderr


def test_corrupted_bundle_is_refused_before_anything_runs(nan_run: NanRun, tmp_path: Path) -> None:
    project, bundle, _ = nan_run
    broken = tmp_path / "step-broken"
    shutil.copytree(bundle, broken)
    data = bytearray((broken / "object-model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (broken / "object-model.pt").write_bytes(bytes(data))
    result = project.prudent("replay", str(broken), "--", sys.executable, "-c",
                             "raise SystemExit(9)")  # never started: the bundle is checked first
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"prudent: error: capture bundle {broken} is unusable: object-model.pt is corrupted "
        "(sha256 differs from the manifest); refusing to replay it: capture it again, or replay "
        "from a checkpoint: prudent replay RUN --step S -- python train.py")
    (broken / "manifest.json").unlink()
    result = project.prudent("replay", str(broken), "--", sys.executable, SCRIPT)
    assert result.returncode == 2 and "it has no manifest.json" in result.stderr


def test_replay_run_to_step_resumes_from_a_checkpoint_and_reproduces_it(nan_run: NanRun) -> None:
    project, bundle, _ = nan_run
    step = int(bundle.name.removeprefix("step-"))
    originals = project.path / ".prudent/runs/nan-run/checkpoints"
    before = {p.name: p.stat().st_mtime_ns for p in originals.rglob("*")}
    result = project.prudent("replay", "nan-run", "--step", str(step), "--json", "--",
                             sys.executable, SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    newest = max(int(n.removeprefix("ckpt-")) for n in before
                 if n.startswith("ckpt-") and not n.endswith(".shards"))
    assert report["source"]["checkpoint"] == f"ckpt-{newest:010d} (step {newest})"
    assert report["step"] == step and report["reproduced"] and report["recorded_loss"] == "nan"
    assert "returned nan values" in report["error"]  # debug mode: anomaly detection raised
    assert [o["sample_index"] for o in report["offending"]] == [BAD_SAMPLE]
    assert "prudent debug |" in result.stderr  # debug mode was on
    assert {p.name: p.stat().st_mtime_ns for p in originals.rglob("*")} == before


def test_debug_run_logs_events_and_a_raising_step_is_captured_and_replayed(tmp_path: Path) -> None:
    project = Project(tmp_path)
    exception_script = script("replay_exception.py")
    ran = project.prudent("run", "--debug", "--run-id", "bad-label", "--", sys.executable,
                          exception_script)
    assert ran.returncode == 1
    assert "prudent debug |" in ran.stderr and "batch_loaded: epoch 1 batch 1: batch[0]: " \
        "float32[16, 8] cpu" in ran.stderr
    (bundle,) = (tmp_path / ".prudent/runs/bad-label/captures").iterdir()
    info = json.loads((bundle / "info.json").read_text())
    assert info["error"] == "IndexError: label 5 out of range for 2 classes"
    assert "replay_exception.py" in info["traceback"] and info["phase"] == "forward"
    assert 77 in info["sample_indices"]
    result = project.prudent("replay", str(bundle), "--", sys.executable, exception_script)
    assert result.returncode == 0, result.stderr
    assert "raised: IndexError: label 5 out of range for 2 classes" in result.stdout
    assert "verdict: REPRODUCED" in result.stdout


@pytest.mark.slow
def test_replay_with_pdb_stops_in_the_users_loop_at_the_nan(nan_run: NanRun) -> None:
    project, bundle, _ = nan_run
    result = project.prudent("replay", str(bundle), "--pdb", "--", sys.executable, SCRIPT,
                             input="p float(loss)\np xb.shape\nc\n")
    assert result.returncode == 0, result.stderr
    assert "you are after run.backward(loss) in your loop" in result.stdout
    assert "replay_nan_sample.py" in result.stdout and "(Pdb) nan" in result.stdout
    assert "torch.Size([32, 16])" in result.stdout
