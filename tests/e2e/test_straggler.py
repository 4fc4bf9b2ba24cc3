"""Under torchrun (gloo on CPU), two ranks: the rank the job waits for is named, with its
host and its numbers; ranks alike name no one."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.e2e.conftest import Project, script


def straggler_run(project: Project, run_id: str, slow_ms: int) -> tuple[list[dict], str]:
    """The run's straggler findings, and what ``prudent run`` wrote to stderr."""
    (project.path / "prudent.yaml").write_text(json.dumps({
        "profile": {"straggler": {"interval_s": 0.5}}, "checkpoint": {"enabled": False}}))
    result = project.prudent(
        "run", "--run-id", run_id, "--set", f"slow_ms={slow_ms}", "--", sys.executable, "-m",
        "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        script("ddp_straggler.py"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    compared = re.search(r"COMPARISONS (\d+)", result.stdout)
    assert compared and int(compared.group(1)) >= 1, result.stdout[-2000:]  # they did compare
    shown = project.show(run_id)
    findings = [e for e in shown["events"] if (e["kind"], e["name"]) == ("finding", "straggler")]
    return findings, result.stderr


@pytest.mark.slow
def test_a_rank_that_sleeps_before_its_forward_is_named_the_straggler(project: Project) -> None:
    findings, stderr = straggler_run(project, "slow", slow_ms=20)
    assert len(findings) == 1, findings  # once, however often the ranks compared
    finding = findings[0]
    payload = finding["payload"]
    assert payload["rank"] == 1 and payload["num_ranks"] == 2
    # ~5 ms of "forward" against ~25 ms: the sleep shows on rank 1, not in rank 0's waits
    assert payload["busy_ms"] - payload["others_busy_ms"] > 15, payload
    assert finding["message"].startswith(f"rank 1 on {payload['host']} spends ")
    assert stderr.count(f"straggler: {finding['message']}") == 1  # rank 0's console line
    profile = project.prudent("profile", "slow", "--json")  # and the profile says it too
    assert [f["id"] for f in json.loads(profile.stdout)["profile"]["findings"]] == ["straggler"]


@pytest.mark.slow
def test_ranks_alike_name_no_straggler(project: Project) -> None:
    findings, stderr = straggler_run(project, "even", slow_ms=0)
    assert findings == [] and "straggler:" not in stderr
