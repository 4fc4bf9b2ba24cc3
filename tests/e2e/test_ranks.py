"""Per-rank state under torchrun (gloo on CPU): each rank's own streams come back, a
checkpoint moves to another number of ranks without a sample trained twice, and ranks that
resumed from different checkpoints never train together."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import Project, torchrun_command
from tests.e2e.test_resume import assert_identical, final_state

# the ranks agree at every step (by default about every 0.2 s of training, which on these
# runs' ~1 ms steps would land a stop many steps after it was asked): the steps asserted
# below are then exact
EVERY_STEP = {"PRUDENT_RANKS_AGREE_EVERY_S": "0"}


def torchrun(name: str, num_ranks: int = 2) -> list[str]:
    return torchrun_command(name, num_ranks)


def losses(log: Path) -> list[list[tuple[int, str]]]:
    """(step, loss) lines of each process that wrote ``log``, in order."""
    by_pid: dict[str, list[tuple[int, str]]] = {}
    for line in log.read_text().splitlines():
        pid, step, loss = line.split()
        by_pid.setdefault(pid, []).append((int(step), loss))
    return list(by_pid.values())


@pytest.mark.slow
def test_ranks_seeded_apart_resume_their_own_streams_bit_identical(project: Project) -> None:
    # resumed from a periodic checkpoint (no stop save): the steps after it are trained again
    (project.path / "prudent.yaml").write_text("checkpoint:\n  on_stop: false\n")
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "10steps", "PRUDENT_CONSOLE": "off", **EVERY_STEP})
    reference = project.prudent("run", "--run-id", "reference", "--set", "out=ref.pt", "--",
                                *torchrun("ddp_rank_seeds.py"), timeout=300)
    assert reference.returncode == 0, reference.stderr
    uninterrupted = [losses(project.path / f"rank{r}.log")[0] for r in (0, 1)]
    assert sum(a == b for a, b in zip(*uninterrupted)) == 0  # two streams, never equal
    for rank in (0, 1):
        (project.path / f"rank{rank}.log").unlink()

    result = project.prudent("run", "--run-id", "seeds", "--max-restarts", "1",
                             "--restart-backoff-s", "0.1", "--set", "stop_rank1_at=25", "--",
                             *torchrun("ddp_rank_seeds.py"), timeout=300)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        first, second = losses(project.path / f"rank{rank}.log")
        assert first[-1][0] == 26 and second[0][0] == 21  # resumed from step 20's checkpoint
        # every step, first try and retry alike, has the loss of the uninterrupted run
        assert first == uninterrupted[rank][:26] and second == uninterrupted[rank][20:]
    assert_identical(final_state(project.path / "ref.pt"), final_state(project.path / "final.pt"))
    saved = [e for e in project.show("seeds")["events"] if e["name"] == "saved"]
    assert [e["step"] for e in saved][:2] == [10, 20]  # agreed saves, on the schedule's steps


@pytest.mark.slow
def test_an_epoch_on_four_ranks_then_three_then_two_trains_every_sample_once(
        project: Project) -> None:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "1000steps", "PRUDENT_CONSOLE": "off", **EVERY_STEP})
    stopped = project.prudent("run", "--run-id", "world", "--set", "stop_rank1_at=4", "--",
                              *torchrun("ddp_world_change.py", 4), timeout=300)
    assert stopped.returncode == 75, stopped.stderr
    # asked at step 4, stopped at 5: 5 batches of 4 on 4 ranks, 80 of the epoch's 256
    # samples; 3 ranks cannot take 80 in whole batches each: the rest is dealt over them
    again = project.prudent("run", "--run-id", "world", "--set", "stop_rank1_at=9", "--",
                            *torchrun("ddp_world_change.py", 3), timeout=300)
    assert again.returncode == 75, again.stderr
    resumed = project.prudent("run", "--run-id", "world", "--set", "stop_rank1_at=0", "--",
                              *torchrun("ddp_world_change.py", 2), timeout=300)
    assert resumed.returncode == 0, resumed.stderr

    trained: Counter[int] = Counter()
    for line in (project.path / "samples.log").read_text().splitlines():
        _, epoch, *indices = line.split()
        if epoch == "0":
            trained.update(int(i) for i in indices)
    assert sorted(trained) == list(range(256))  # every sample of the interrupted epoch...
    assert set(trained.values()) == {1}  # ...exactly once, on 4 ranks, then 3, then 2
    changed = [e["message"] for e in project.show("world")["events"]
               if e["name"] == "world_changed"]
    assert changed[0] == ("checkpoint taken on 4 ranks, resumed on 3; 80 samples of epoch 1 "
                          "already trained, the rest of it dealt over 3 ranks")
    assert changed[1].startswith("checkpoint taken on 3 ranks, resumed on 2; ")


@pytest.mark.slow
def test_ranks_that_resumed_from_different_checkpoints_are_refused(project: Project) -> None:
    project.env.update({"PRUDENT_CONSOLE": "off", **EVERY_STEP, "OWN_LOCATION": "1"})
    first = project.prudent("run", "--run-id", "nodes", "--set", "stop_rank1_at=5", "--",
                            *torchrun("ddp_rank_seeds.py"), timeout=300)
    assert first.returncode == 75, first.stderr
    again = project.prudent("run", "--run-id", "nodes", "--", *torchrun("ddp_rank_seeds.py"),
                            timeout=300)
    assert again.returncode == 2, again.stderr
    assert "did not resume from the same checkpoint" in again.stderr
    assert "rank 1: step 0 (no checkpoint)" in again.stderr
    steps = [int(line.split()[1]) for line in (project.path / "rank0.log").read_text().splitlines()]
    assert max(steps) == 6  # nothing more was trained


@pytest.mark.slow
def test_torchrun_restarting_its_workers_resumes_them_from_the_newest_checkpoint(
        project: Project) -> None:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "10steps", "PRUDENT_CONSOLE": "off",
                        **EVERY_STEP})
    reference = project.prudent("run", "--run-id", "reference", "--set", "out=ref.pt", "--",
                                *torchrun("ddp_rank_seeds.py"), timeout=300)
    assert reference.returncode == 0, reference.stderr
    for rank in (0, 1):
        (project.path / f"rank{rank}.log").unlink()
    # plain torchrun, no prudent run: the run id is torchrun's, the same for both attempts
    command = [*torchrun("ddp_rank_seeds.py")]
    command.insert(command.index("--standalone"), "--max-restarts=1")
    project.env["PRUDENT_SET"] = '{"crash_rank1_at": 25}'  # what prudent run --set passes
    # torch 2.13, gloo: restarted workers sharing torchrun's store fail to connect (stale
    # addresses, with or without prudent); a store of their own per attempt works
    project.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    crashed = project.python(*command[1:], timeout=300)
    assert crashed.returncode == 0, crashed.stderr
    first, second = losses(project.path / "rank1.log")
    assert first[-1][0] == 24 and second[0][0] == 21  # crashed in step 25; resumed after 20
    assert_identical(final_state(project.path / "ref.pt"), final_state(project.path / "final.pt"))
