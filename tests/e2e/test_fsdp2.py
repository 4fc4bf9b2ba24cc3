"""FSDP2 (`fully_shard`, DTensor parameters) under torchrun on gloo: the guardrails measure
global numbers with every rank making the same collectives, a NaN on one rank stops all, and
a run stopped and resumed (each rank's shards through torch.distributed.checkpoint) ends with
the model an uninterrupted run ends with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.e2e.conftest import Project, torchrun_command
from tests.e2e.test_resume import assert_identical, final_state


def torchrun(*args: str) -> list[str]:
    return [*torchrun_command("fsdp2_train.py"), *args]


@pytest.fixture
def fsdp2(project: Project) -> Project:
    return _fsdp2_project(project)


def _fsdp2_project(project: Project) -> Project:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "off", "PRUDENT_CONSOLE": "off"})
    # no save at an epoch's end or a stop either; any measured gradient norm is "above
    # max_norm": each alert records the monitor's global norm at its step
    (project.path / "prudent.yaml").write_text(
        "checkpoint: {at_epoch_end: false, on_stop: false}\n"
        "monitor:\n  rules:\n    exploding_gradient: {max_norm: 1.0e-9, action: alert, "
        "warmup_steps: 0, cooldown_steps: 10}\n")
    return project


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model an uninterrupted FSDP2 job on 2 ranks ends with, no checkpoint taken: what
    every stopped-and-resumed job below must end with, whatever its checkpoints."""
    project = _fsdp2_project(Project(tmp_path_factory.mktemp("fsdp2-reference")))
    result = project.prudent("run", "--run-id", "reference", "--set", "out=ref.pt", "--",
                             *torchrun(), timeout=300)
    assert_completed(project, "reference", result)
    return project.path / "ref.pt"


def assert_completed(project: Project, run: str, result: Any) -> None:
    """Trained to the end, by the record: gloo under FSDP2 now and then aborts a worker in
    destroy_process_group, after the record is closed (exit 1 from torchrun then; see
    research/scale-out.md, "CI on CPU")."""
    shown = project.show(run)
    assert shown["status"] == "completed", result.stderr
    assert result.returncode == 0 or "Signal 6 (SIGABRT)" in result.stderr, result.stderr


def logged(project: Project, rank: int) -> dict[int, float]:
    """Step -> torch's global gradient norm, for each step the rank completed."""
    lines = (project.path / f"rank{rank}.log").read_text().splitlines()
    return {int(step): float(norm) for _, step, norm in map(str.split, lines)}


@pytest.mark.slow
def test_fsdp2_run_completes_with_the_global_gradient_norm_in_its_record(fsdp2: Project) -> None:
    result = fsdp2.prudent("run", "--run-id", "fsdp2", "--", *torchrun(), timeout=300)
    assert_completed(fsdp2, "fsdp2", result)
    shown = fsdp2.show("fsdp2")
    assert (shown["status"], shown["step"]) == ("completed", 100)
    expected = logged(fsdp2, 0)
    assert sorted(expected) == sorted(logged(fsdp2, 1)) == list(range(1, 101))
    alerts = [e for e in shown["events"] if (e["kind"], e["name"]) == ("rule", "exploding_gradient")]
    assert len(alerts) >= 5  # one every cooldown_steps, at a step whose norm was measured
    for alert in alerts:
        norm = alert["payload"]["value"]
        assert norm == pytest.approx(expected[alert["step"]], rel=1e-6), alert["message"]


@pytest.mark.slow
def test_nan_on_one_fsdp2_rank_stops_every_rank(fsdp2: Project) -> None:
    result = fsdp2.prudent("run", "--run-id", "nan", "--set", "nan_rank1_at=30", "--",
                           *torchrun(), timeout=300)
    shown = fsdp2.show("nan")
    assert (shown["status"], shown["stop_reason"]) == ("stopped", "rule:non_finite"), result.stderr
    last = [max(logged(fsdp2, rank)) for rank in (0, 1)]
    # together, at the ranks' next agreement (about 0.2 s of training later; at the planned
    # last step at the latest)
    assert last[0] == last[1] and 30 <= last[0] <= 100
    bundle = fsdp2.path / ".prudent" / "runs" / "nan" / "captures" / "step-30-rank1"
    weights = torch.load(bundle / "object-model.pt", weights_only=True)  # no DTensor: loadable
    assert weights["0.weight"].shape == (16, 8)  # rank 1's shard of the 32 x 8 weight


@pytest.mark.slow
def test_fsdp2_stopped_and_resumed_ends_with_the_same_full_model(fsdp2: Project,
                                                                 reference: Path) -> None:
    fsdp2.env.update({"PRUDENT_RANKS_AGREE_EVERY_S": "0", "PRUDENT_CHECKPOINT_EVERY": "20steps"})
    # resumed from step 20's periodic checkpoint (no stop save), whose shards were written
    # in the background while steps 21 on trained
    (fsdp2.path / "prudent.yaml").write_text("checkpoint:\n  keep: 2\n  on_stop: false\n")
    resumed = fsdp2.prudent("run", "--run-id", "sharded", "--max-restarts", "1",
                            "--restart-backoff-s", "0.1", "--set", "stop_rank1_at=30",
                            "--set", "out=final.pt", "--", *torchrun(), timeout=300)
    assert_completed(fsdp2, "sharded", resumed)
    shown = fsdp2.show("sharded")
    assert (shown["status"], shown["restarts"]) == ("completed", 1)
    assert [e["step"] for e in shown["events"] if e["name"] == "resumed"] == [20]
    assert_identical(final_state(reference), final_state(fsdp2.path / "final.pt"))
    checkpoints = fsdp2.path / ".prudent" / "runs" / "sharded" / "checkpoints"
    # each checkpoint's shards beside it, one file per rank; older ones deleted with theirs
    folders = {p.name for p in checkpoints.glob("ckpt-*")}
    kept = sorted(name for name in folders if not name.endswith(".shards"))
    assert len(kept) == 2 and kept[-1] == "ckpt-0000000100"  # keep: 2
    assert folders == {*kept, *(f"{name}.shards" for name in kept)}
    assert sorted(p.name for p in (checkpoints / "ckpt-0000000100.shards").glob("*.distcp")) \
        == ["__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
def test_fsdp2_shards_of_two_ranks_resume_on_one(fsdp2: Project) -> None:
    fsdp2.env.update({"PRUDENT_RANKS_AGREE_EVERY_S": "0"})
    (fsdp2.path / "prudent.yaml").write_text("checkpoint:\n  every: 1000steps\n")
    stopped = fsdp2.prudent("run", "--run-id", "shrink", "--set", "stop_rank1_at=30", "--",
                            *torchrun(), timeout=300)
    assert stopped.returncode == 75, stopped.stderr
    one_rank = [*torchrun()]
    one_rank[one_rank.index("--nproc-per-node") + 1] = "1"
    resumed = fsdp2.prudent("run", "--run-id", "shrink", "--", *one_rank, timeout=300)
    assert_completed(fsdp2, "shrink", resumed)
    shown = fsdp2.show("shrink")
    # 31 steps on 2 ranks are 62 of epoch 1's 100 batches on one rank: 38 more, then 100
    assert (shown["status"], shown["step"]) == ("completed", 31 + 38 + 100)
    changed = [e for e in shown["events"] if e["name"] == "world_changed"]
    assert changed and "496 samples of epoch 1 already trained" in changed[0]["message"]


@pytest.mark.slow
def test_fsdp2_shards_on_an_s3_bucket_resume_exactly_and_a_changed_byte_is_refused(
        fsdp2: Project, s3_endpoint: str, reference: Path) -> None:
    import uuid

    import s3fs

    fsdp2.env.update({"PRUDENT_RANKS_AGREE_EVERY_S": "0"})
    (fsdp2.path / "prudent.yaml").write_text("checkpoint:\n  every: 1000steps\n")
    s3 = s3fs.S3FileSystem(key="testing", secret="testing",
                           client_kwargs={"endpoint_url": s3_endpoint})
    bucket = f"bucket-{uuid.uuid4().hex[:8]}"
    s3.mkdir(bucket)
    fsdp2.env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                      "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": s3_endpoint,
                      "PRUDENT_CHECKPOINT_URL": f"s3://{bucket}/ckpts"})
    stopped = fsdp2.prudent("run", "--run-id", "s3", "--set", "stop_rank1_at=30", "--",
                            *torchrun(), timeout=300)
    assert stopped.returncode == 75, stopped.stderr
    shard = f"{bucket}/ckpts/ckpt-0000000031.shards/__1_0.distcp"
    good = s3.cat_file(shard)
    s3.pipe_file(shard, good[:100] + bytes([good[100] ^ 1]) + good[101:])  # one bit, same size

    refused = fsdp2.prudent("run", "--run-id", "s3", "--set", "out=final.pt", "--", *torchrun(),
                            timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert "ckpt-0000000031.shards/__1_0.distcp differs from the checksum" in refused.stderr
    assert fsdp2.show("s3")["step"] == 31  # nothing trained
    assert not (fsdp2.path / "final.pt").exists()

    s3.pipe_file(shard, good)
    resumed = fsdp2.prudent("run", "--run-id", "s3", "--set", "out=final.pt", "--", *torchrun(),
                            timeout=300)
    assert_completed(fsdp2, "s3", resumed)
    assert_identical(final_state(reference), final_state(fsdp2.path / "final.pt"))
    newest = max(p for p in s3.ls(f"{bucket}/ckpts", refresh=True)
                 if p.rsplit("/", 1)[-1].startswith("ckpt-") and not p.endswith(".shards"))
    manifest = s3.cat_file(f"{newest}/manifest.json")  # each shard file listed with its hash
    assert b'"__1_0.distcp"' in manifest and b'".metadata"' in manifest


def shards_content(folder: Path, out: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's DCP shards read back whole (DCP's own converter), by prudent's keys
    ("model/<name>", "optimizer/state.<name>.<field>")."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder, out)
    return torch.load(out, weights_only=True)


def assert_resumed_with(start: dict[str, Any], model: dict[str, torch.Tensor],
                        optimizer: dict[str, dict[str, torch.Tensor]]) -> None:
    """The model and optimizer a phase started from are the checkpoint's, value for value."""
    assert sorted(start["model"]) == sorted(model)
    for name, tensor in model.items():
        assert torch.equal(start["model"][name], tensor), name
    assert sorted(start["optimizer"]["state"]) == sorted(optimizer)
    for name, fields in optimizer.items():
        for field, tensor in fields.items():
            assert torch.equal(start["optimizer"]["state"][name][field], tensor), (name, field)


@pytest.mark.slow
def test_a_checkpoint_resumes_under_another_parallelism(fsdp2: Project) -> None:
    """FSDP2 on 2 ranks -> one bare process -> FSDP2 -> DDP, each phase stopped by a notice
    and the next resumed from its stop checkpoint: each starts from exactly the state saved."""
    fsdp2.env.update({"PRUDENT_RANKS_AGREE_EVERY_S": "0"})
    (fsdp2.path / "prudent.yaml").write_text("checkpoint:\n  every: 1000steps\n  keep: 5\n")
    checkpoints = fsdp2.path / ".prudent" / "runs" / "moved" / "checkpoints"
    one_rank = [*torchrun()]
    one_rank[one_rank.index("--nproc-per-node") + 1] = "1"
    resumed_from: list[str] = []

    def phase(command: list[str], *settings: str, code: int = 75) -> str:
        result = fsdp2.prudent("run", "--run-id", "moved", *(a for s in settings
                                                             for a in ("--set", s)),
                               "--", *command, timeout=300)
        if code == 75:
            assert result.returncode == 75, result.stderr
        else:
            assert_completed(fsdp2, "moved", result)
        names = [e["payload"]["checkpoint"] for e in fsdp2.show("moved")["events"]
                 if e["name"] == "resumed"]
        resumed_from[:] = names
        return names[-1] if names else ""

    phase(torchrun(), "stop_at=30")  # FSDP2, 2 ranks: saved in shards
    first = phase(one_rank, "wrap=none", "stop_at=60", "start_out=none.pt")
    saved = shards_content(checkpoints / f"{first}.shards", fsdp2.path / "first.pt")
    assert_resumed_with(torch.load(fsdp2.path / "none.pt", weights_only=True),
                        {k[6:]: v for k, v in saved.items() if k.startswith("model/")},
                        _flattened(saved))

    # one process wrote its whole state once (one shard file), read back into FSDP2's shards
    second = phase(torchrun(), "wrap=fsdp2", "stop_at=90", "start_out=fsdp2.pt")
    assert sorted(p.name for p in (checkpoints / f"{second}.shards").glob("*.distcp")) == \
        ["__0_0.distcp"]
    saved = shards_content(checkpoints / f"{second}.shards", fsdp2.path / "second.pt")
    assert_resumed_with(torch.load(fsdp2.path / "fsdp2.pt", weights_only=True),
                        {k[6:]: v for k, v in saved.items() if k.startswith("model/")},
                        _flattened(saved))

    third = phase(torchrun(), "wrap=ddp", "start_out=ddp.pt", code=0)  # shards -> DDP
    saved = shards_content(checkpoints / f"{third}.shards", fsdp2.path / "third.pt")
    assert_resumed_with(torch.load(fsdp2.path / "ddp.pt", weights_only=True),
                        {k[6:]: v for k, v in saved.items() if k.startswith("model/")},
                        _flattened(saved))
    assert len(resumed_from) == 3 and len(set(resumed_from)) == 3
    assert fsdp2.show("moved")["status"] == "completed"


def _flattened(saved: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """DCP's flattened optimizer keys ("optimizer/state.<name>.<field>") by name and field."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in saved.items():
        if key.startswith("optimizer/state."):
            name, field = key[len("optimizer/state."):].rsplit(".", 1)
            found.setdefault(name, {})[field] = tensor
    return found


@pytest.mark.slow
def test_a_model_left_bare_under_torchrun_is_named_once_and_a_wrapped_one_is_not(
        fsdp2: Project) -> None:
    """The README's lines under torchrun as they are: each rank trains its own copy of a bare
    model, which nothing averages; one warning says so (rank 0's), DDP and FSDP2 get none."""
    warning = "model is attached under torchrun (2 ranks) but neither wrapped"
    for wrap, warned in (("none", True), ("ddp", False), ("fsdp2", False)):
        result = fsdp2.prudent("run", "--run-id", f"wrap-{wrap}", "--set", f"wrap={wrap}",
                               "--set", "epochs=1", "--", *torchrun(), timeout=300)
        assert_completed(fsdp2, f"wrap-{wrap}", result)
        assert result.stderr.count(warning) == (1 if warned else 0), (wrap, result.stderr[-2000:])
        events = [e for e in fsdp2.show(f"wrap-{wrap}")["events"] if e["name"] == "unreplicated_model"]
        assert len(events) == (1 if warned else 0)
