"""Every node of one distributed job names the same run without ``--run-id``: the launcher's id."""

from __future__ import annotations

import pytest

from prudent.distributed.torchrun import Ranks
from prudent.kernel.units import validate_run_id
from prudent.wiring.session import _shared_run_id

RANK0, RANK3 = Ranks(rank=0, world_size=4), Ranks(rank=3, world_size=4, local_rank=1)
TORCHRUN = {"TORCHELASTIC_RUN_ID": "rdzv42"}
SLURM = {"SLURM_JOB_ID": "81723", "SLURM_STEP_ID": "0"}
SKYPILOT = {"SKYPILOT_TASK_ID": "sky-2026-01-02-03-04-05-678901_gpus_2"}


@pytest.mark.parametrize(("environ", "expected"), [
    ({**TORCHRUN, **SLURM, **SKYPILOT}, "train-rdzv42"),  # the rendezvous id comes first
    ({"TORCHELASTIC_RUN_ID": "none", **SLURM, **SKYPILOT}, "train-81723"),  # no --rdzv-id
    ({**SLURM, **SKYPILOT}, "train-81723"),
    ({"TORCHELASTIC_RUN_ID": "none", **SKYPILOT}, "train-sky-2026-01-02-03-04-05-678901_gpus_2"),
])
def test_every_rank_of_a_distributed_job_names_the_launchers_job(
        environ: dict[str, str], expected: str) -> None:
    assert _shared_run_id("train", RANK0, environ) == expected
    assert _shared_run_id("train", RANK3, environ) == expected  # another node, same run


def test_without_a_launcher_id_each_process_gets_a_fresh_id() -> None:
    first = _shared_run_id("train", RANK0, {"TORCHELASTIC_RUN_ID": "none"})
    assert first.startswith("train-") and first != _shared_run_id("train", RANK0, {})


def test_a_single_process_keeps_a_fresh_id_even_inside_a_slurm_job() -> None:
    # one process is one run per launch, as before: a shared id would make every step of
    # an sbatch script continue the same run
    assert _shared_run_id("train", Ranks(), SLURM) != "train-81723"


def test_characters_a_run_id_cannot_hold_become_dashes() -> None:
    run_id = _shared_run_id("My Model!", RANK0, {"TORCHELASTIC_RUN_ID": "team/job 7"})
    assert run_id == "my-model-team-job-7" and validate_run_id(run_id) == run_id
    assert len(_shared_run_id("x" * 100, RANK0, {"SLURM_JOB_ID": "9" * 200})) == 128


def test_every_nodes_prudent_run_names_the_job_by_torchruns_rendezvous_id() -> None:
    from prudent.launch.supervisor import job_run_id

    command = ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-id", "job 42",
               "train.py"]
    assert job_run_id(command, "train") == "train-job-42"
    assert job_run_id(["torchrun", "--rdzv_id=7", "train.py"], "train") == "train-7"
    assert job_run_id(["torchrun", "--standalone", "train.py"], "train") is None
    assert job_run_id(["python", "train.py"], "train") is None
