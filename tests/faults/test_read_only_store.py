"""A store on read-only media (an archive, a read-only mount of a finished project) is read
by every command that only reads: runs, show, profile, report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Project, script
from tests.faults.conftest import mounted_tmpfs, remount_read_only


@pytest.mark.slow
def test_reading_commands_read_a_store_on_read_only_media(project: Project,
                                                          tmp_path: Path) -> None:
    media = mounted_tmpfs(tmp_path / "archive", "16m")
    project.env.update({"PRUDENT_HOME": str(media / "home"), "PRUDENT_CONSOLE": "off",
                        "PRUDENT_CHECKPOINT_URL": str(project.path / "checkpoints")})
    trained = project.prudent("run", "--run-id", "kept", "--", sys.executable,
                              script("store_outage_train.py"), "30")
    assert trained.returncode == 0, trained.stderr
    remount_read_only(media)

    runs = project.prudent("runs", "--json")
    assert runs.returncode == 0, runs.stderr
    assert [(r["id"], r["status"], r["step"]) for r in json.loads(runs.stdout)] == [
        ("kept", "completed", 30)]
    shown = project.prudent("show", "kept", "--json")
    assert shown.returncode == 0, shown.stderr
    assert "end" in [e["name"] for e in json.loads(shown.stdout)["events"]]
    assert project.prudent("profile", "kept").returncode == 0
    report = project.prudent("report", "kept", "-o", str(tmp_path / "kept.html"))
    assert report.returncode == 0, report.stderr
    assert "kept" in (tmp_path / "kept.html").read_text()
