"""benchmarks/ranks_agreement.py runs its arms in one torchrun job and tells them apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_the_agreement_costs_the_step_far_less_than_a_blocking_flag(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ranks_agreement.py"),
                    "--steps", "1600", "--block", "40", "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    arms = json.loads(out.read_text())["arms"]
    assert {"kernel", "agreement", "blocking"} <= set(arms)
    # inside run.step: a collective every step against one every ~0.2 s of training
    assert arms["blocking"]["in_run_step_us"] > 4 * arms["agreement"]["in_run_step_us"]
