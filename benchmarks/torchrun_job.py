"""Run a benchmark file under torchrun from a plain ``python benchmarks/X.py``: the ranks
run its worker, rank 0 writes the result JSON, this process prints and keeps it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESULT_ENV = "BENCH_OUT"  # where rank 0 writes the result, for the launching process


def run_as_job(script: str, num_ranks: int, env: Mapping[str, str], json_path: str,
               report: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """``script`` (with this process's arguments) on ``num_ranks`` local ranks; the result
    rank 0 wrote to ``$BENCH_OUT`` is reported and written to ``json_path``."""
    with tempfile.TemporaryDirectory() as folder:
        env = {**env, RESULT_ENV: str(Path(folder) / "result.json")}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(num_ranks), script, *sys.argv[1:]],
                       env=env, check=True)
        result = json.loads(Path(env[RESULT_ENV]).read_text())
    report(result)
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(result, indent=2))
    print(f"wrote {json_path}")
    return result
