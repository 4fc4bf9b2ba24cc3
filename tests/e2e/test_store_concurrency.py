from __future__ import annotations

import subprocess
import sys

import pytest

from prudent.store.database import Store
from tests.e2e.conftest import Project, script


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_processes_logging_10000_metrics_each_lose_no_rows(
        project: Project, backend: str, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{project.path / '.prudent' / 'prudent.db'}"
    if backend == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
        project.env["PRUDENT_STORE_URL"] = url
    processes = [subprocess.Popen([sys.executable, script("log_many.py"), "10000"],
                                  cwd=project.path, env=project.env, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    store = Store(url)
    runs = store.list_runs()
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs)
    # the script's own series (the profiler adds its machine series, profile/*, beside it)
    assert [store.count_metrics(r["id"], "value") for r in runs] == [10_000, 10_000]
    assert store.count_metrics(name="value") == 20_000
    store.close()
