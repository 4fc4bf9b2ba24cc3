"""Stall stacks per rank: the verdict each rank gives its own main thread, the file names, and
rank 0 naming the hung rank from its peers' files (two real ranks: tests/e2e/test_hung_rank.py)."""

from __future__ import annotations

import io
import os
import time
import traceback
from pathlib import Path

import pytest

import prudent
from prudent.distributed.torchrun import Ranks
from prudent.monitor import Monitor
from prudent.monitor.stall_stacks import (
    DEVICE,
    HUNG,
    PEERS,
    RankStacks,
    StallVerdict,
    hung_peers,
    judge_stack,
    stacks_file,
)
from prudent.testing import make_settings

SITE = "/venv/lib/python3.12/site-packages"


def frames(*where: tuple[str, str, str]) -> list[traceback.FrameSummary]:
    """A main thread's stack, outermost first: (file, function, line) each."""
    return [traceback.FrameSummary(path, 10 + i, name, line=line)
            for i, (path, name, line) in enumerate(where)]


TRAIN = ("/home/me/train.py", "<module>", "loss = model(x).sum()")


@pytest.mark.parametrize(("stack", "kind", "shown"), [
    (frames(TRAIN, ("/home/me/train.py", "<module>", "time.sleep(3600)")), HUNG,
     "time.sleep(3600) in <module>, me/train.py:11"),
    (frames(TRAIN, (f"{SITE}/torch/distributed/c10d_logger.py", "wrapper", "return func()"),
            (f"{SITE}/torch/distributed/distributed_c10d.py", "all_reduce", "work.wait()")),
     PEERS, "work.wait() in all_reduce, distributed/distributed_c10d.py:12"),
    (frames(TRAIN, (f"{SITE}/torch/_tensor.py", "backward", "torch.autograd.backward("),
            (f"{SITE}/torch/autograd/graph.py", "_engine_run_backward", "return run_backward(")),
     PEERS, "in backward, where DDP reduces gradients: _engine_run_backward, autograd/graph.py:12"),
    (frames(("/home/me/train.py", "<module>", "handle.wait()  # the async all_reduce")), PEERS,
     "handle.wait() in <module>, me/train.py:10"),
    (frames(("/home/me/train.py", "<module>", "print(loss.item())")), DEVICE, "loss.item()"),
    # a user's forward that hangs, called from DDP's forward: the innermost frame is the user's
    (frames((f"{SITE}/torch/nn/parallel/distributed.py", "forward", "self._run_ddp_forward()"),
            ("/home/me/model.py", "forward", "self.lock.acquire()")), HUNG, "self.lock.acquire()"),
    ([], HUNG, "no Python frame"),
])
def test_a_rank_judges_its_main_thread_by_its_innermost_frame(
        stack: list[traceback.FrameSummary], kind: str, shown: str) -> None:
    judged, where = judge_stack(stack)
    assert judged == kind and shown in where


def test_each_rank_has_its_own_file_and_a_single_process_keeps_its_name() -> None:
    assert stacks_file(Ranks(3, 8)) == "stalled-stacks-rank3.txt"
    assert stacks_file(Ranks()) == "stalled-stacks.txt"


def test_the_first_line_says_whether_the_rank_hangs() -> None:
    assert StallVerdict(1, 2, HUNG, "x").line == (
        "rank 1 of 2 is the hung rank: its main thread is not waiting for its peers (x)")
    assert StallVerdict(0, 2, PEERS, "y").line.startswith(
        "rank 0 of 2 waits for its peers in a collective (y): not the hung rank")


def write_peer(run_dir: Path, rank: int, kind: str, age_s: float = 0.0) -> None:
    path = run_dir / f"stalled-stacks-rank{rank}.txt"
    path.write_text(StallVerdict(rank, 4, kind, "here").line + "\nprudent: stalled\n")
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


def test_rank_0_finds_the_hung_peer_in_fresh_files_only(tmp_path: Path) -> None:
    since = time.time() - 5
    write_peer(tmp_path, 1, PEERS)
    write_peer(tmp_path, 2, HUNG)
    write_peer(tmp_path, 3, HUNG, age_s=3600)  # an earlier attempt's
    assert hung_peers(tmp_path, Ranks(0, 4), since, wait_s=0.0) == [2]


def test_rank_0_waits_for_its_peers_files_only_so_long(tmp_path: Path) -> None:
    now = [0.0]
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        now[0] += seconds

    write_peer(tmp_path, 1, PEERS)  # rank 2's file never comes (another node's disk)
    assert hung_peers(tmp_path, Ranks(0, 3), time.time() - 5, wait_s=1.0,
                      clock=lambda: now[0], sleep=nap) == []
    assert 9 <= len(naps) <= 11


def test_rank_0_that_waits_names_the_hung_rank_in_its_note(tmp_path: Path) -> None:
    stacks = RankStacks(tmp_path, since=time.time() - 5, ranks=Ranks(0, 2))
    stacks.verdict = StallVerdict(0, 2, PEERS, "in backward")
    assert stacks.peers_note(wait_s=0.0) == stacks.note()  # no peer file: its own words
    write_peer(tmp_path, 1, HUNG)
    note = stacks.peers_note(wait_s=0.0)
    assert note is not None and "the hung rank: rank 1 (stalled-stacks-rank1.txt)" in note
    assert RankStacks(tmp_path, 0.0, ranks=Ranks(1, 2)).peers_note(0.0) is None  # not rank 0


def hang(home: Path) -> tuple[prudent.Run, str]:
    """A loop whose main thread sleeps at step 3 (under torchrun with no peer: judged alone)."""
    settings = make_settings(home, monitor={"rules": {"stalled": {
        "timeout_s": 0.4, "grace_s": 0.4}}})
    out = io.StringIO()
    run = prudent.init(name="hang", settings=settings, exit_on_stop=False,
                       components=[Monitor(settings.monitor, stream=out)])
    with run:
        for step in run.batches(range(5)):
            if step == 3:  # a dead mount on this rank's machine
                time.sleep(60)
            run.step(loss=1.0)
    return run, out.getvalue()


def test_under_torchrun_the_hung_rank_writes_its_own_file_verdict_first(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    run, said = hang(home)
    assert run.stop_reason == "rule:stalled"
    assert not (run.context.run_dir / "stalled-stacks.txt").exists()
    text = (run.context.run_dir / "stalled-stacks-rank1.txt").read_text()
    first, second = text.splitlines()[:2]
    assert first.startswith("rank 1 of 2 is the hung rank: its main thread is not waiting for "
                            "its peers (time.sleep(60) in hang,")
    assert second.startswith("prudent: training stalled: no step for")
    assert "time.sleep(60)" in text and "Thread MainThread" in text
    assert "rank 1 of 2 is the hung rank" in said and "stalled-stacks-rank1.txt" in said
