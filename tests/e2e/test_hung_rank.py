"""Under torchrun (gloo on CPU), two ranks, one of which hangs: each rank saves its own
stacks, the hung rank's file says so with its sleeping line, rank 0's says it only waits,
and the record names the hung rank."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.e2e.conftest import Project, script


@pytest.mark.slow
def test_each_rank_saves_its_stacks_and_the_hung_one_is_named(project: Project) -> None:
    (project.path / "prudent.yaml").write_text(json.dumps({
        "monitor": {"rules": {"stalled": {"timeout_s": 3, "grace_s": 2}}},
        "checkpoint": {"enabled": False}}))
    started = time.monotonic()
    result = project.prudent(
        "run", "--run-id", "hang", "--", sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nproc-per-node", "2", script("ddp_hang.py"), timeout=180)
    took = time.monotonic() - started
    assert "HANGING" in result.stdout, result.stderr[-3000:]
    run_dir = project.path / ".prudent" / "runs" / "hang"
    assert not (run_dir / "stalled-stacks.txt").exists()
    hung = (run_dir / "stalled-stacks-rank1.txt").read_text()
    assert hung.startswith("rank 1 of 2 is the hung rank: its main thread is not waiting for "
                           "its peers (time.sleep(3600) in <module>, scripts/ddp_hang.py:"), hung
    assert "time.sleep(3600)" in hung and "Thread MainThread" in hung
    waiting = (run_dir / "stalled-stacks-rank0.txt").read_text()
    assert waiting.startswith("rank 0 of 2 waits for its peers in a collective (in backward, "
                              "where DDP reduces gradients"), waiting
    shown = project.show("hang")
    stalls = [e for e in shown["events"] if (e["kind"], e["name"]) == ("rule", "stalled")]
    assert stalls and "the hung rank: rank 1 (stalled-stacks-rank1.txt)" in stalls[0]["message"]
    print(f"exit {result.returncode} after {took:.1f} s; {stalls[0]['message']}")
