from __future__ import annotations

import subprocess
import sys

from prudent.store import Store
from tests.e2e.conftest import Project, script


def test_two_processes_logging_10000_metrics_each_lose_no_rows(project: Project) -> None:
    processes = [subprocess.Popen([sys.executable, script("log_many.py"), "10000"],
                                  cwd=project.path, env=project.env, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    store = Store(f"sqlite:///{project.path / '.prudent' / 'prudent.db'}")
    runs = store.list_runs()
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs)
    assert [store.count_metrics(r["id"]) for r in runs] == [10_000, 10_000]
    assert store.count_metrics() == 20_000
    store.close()
