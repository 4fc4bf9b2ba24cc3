"""benchmarks/sharded_checkpoint.py times each way of saving on every rank of one job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_each_way_is_timed_on_the_ranks_that_write(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sharded_checkpoint.py"),
                    "--width", "256", "--layers", "2", "--reps", "1", "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    rank0, rank1 = json.loads(out.read_text())["per_rank"]
    assert rank1["rank0"] == {"stall": 0.0, "done": 0.0}  # DDP's path: rank 0 alone writes
    for way in ("dcp", "dcp_async"):  # every rank writes its own shards
        assert rank0[way]["done"] > 0 and rank1[way]["done"] > 0
        assert rank1[way]["done"] >= rank1[way]["stall"]
