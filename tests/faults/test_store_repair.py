"""A damaged store is named by ``prudent store check`` and repaired by ``prudent store repair``:
every readable row kept, the rest added back from the runs' records, the damaged file kept."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import prudent
from prudent.store.database import Store
from prudent.testing import make_settings, tiny_loader, tiny_model

PAGE = 4096


def train(home: Path, name: str) -> str:
    """A real run with checkpoints: its record (segments, heartbeat) lies beside them."""
    settings = make_settings(home, monitor={"enabled": False}, checkpoint={"every": "10steps"})
    run = prudent.init(name=name, settings=settings, exit_on_stop=False)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(1):
            for x, y in run.batches(tiny_loader(num_samples=256, batch_size=8)):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
    return run.id


def prudent_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prudent", *args], cwd=home.parent,
                          env={**os.environ, "PRUDENT_HOME": str(home)}, capture_output=True,
                          text=True, timeout=120)


def counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("runs", "metrics", "events")}


def smash_a_metrics_page(path: Path, run_id: str) -> None:
    """Overwrite one leaf page of the metrics table (a page of ``run_id``'s rows) with
    garbage, as a torn write would: the rows on it are lost, the others still readable."""
    data = bytearray(path.read_bytes())
    pages = [i for i in range(1, len(data) // PAGE)
             if data[i * PAGE] == 0x0D and run_id.encode() in data[i * PAGE:(i + 1) * PAGE]]
    assert len(pages) > 20, "the bulk run's metrics should fill many pages"
    middle = pages[len(pages) // 2]
    data[middle * PAGE:(middle + 1) * PAGE] = b"\xa5" * PAGE
    path.write_bytes(bytes(data))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / ".prudent"


def test_a_corrupt_store_is_named_and_repaired_keeping_every_readable_row(home: Path) -> None:
    kept = train(home, "kept")
    store_path = home / "prudent.db"
    store = Store(f"sqlite:///{store_path}")
    store.create_run("bulk", "bulk")
    store.add_metrics([{"run_id": "bulk", "step": i, "name": "loss", "value": 1.0 / (i + 1),
                        "wall": 1.0e9 + i} for i in range(30000)])
    store.close()
    before = counts(store_path)
    healthy = prudent_cli(home, "store", "check")
    assert healthy.returncode == 0 and "healthy" in healthy.stdout, healthy.stdout + healthy.stderr

    smash_a_metrics_page(store_path, "bulk")
    check = prudent_cli(home, "store", "check", "--json")
    assert check.returncode == 1
    report = json.loads(check.stdout)
    assert not report["ok"] and report["problems"][0].startswith("corrupt: ")
    assert report["rows"]["runs"] == 2  # the page that broke holds metrics alone

    repair = prudent_cli(home, "store", "repair", "--json")
    assert repair.returncode == 0, repair.stderr
    result = json.loads(repair.stdout)
    after = counts(store_path)
    lost = before["metrics"] - after["metrics"]
    assert 0 < lost <= 300  # one page's rows, no more (a 4 kB page holds ~100-200 of them)
    assert result["unreadable"]["metrics"] >= 1
    assert (after["runs"], after["events"]) == (before["runs"], before["events"])
    assert Path(result["damaged_copy"]).is_file()  # nothing thrown away
    assert prudent_cli(home, "store", "check").returncode == 0
    shown = prudent_cli(home, "show", kept, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed"


def test_an_emptied_store_is_rebuilt_from_the_runs_records(home: Path) -> None:
    kept = train(home, "kept")
    store_path = home / "prudent.db"
    before = counts(store_path)
    store_path.write_bytes(b"")  # a copy cut short, a disk that filled
    check = prudent_cli(home, "store", "check", "--json")
    report = json.loads(check.stdout)
    assert check.returncode == 1 and report["runs_only_in_records"] == [kept]
    assert "is empty (0 bytes)" in report["problems"][0]

    repair = prudent_cli(home, "store", "repair")
    assert repair.returncode == 0, repair.stderr
    assert "1 run(s)" in repair.stdout
    after = counts(store_path)
    assert after["metrics"] == before["metrics"]  # every loss row, from the record
    assert after["runs"] == 1
    run = json.loads(prudent_cli(home, "show", kept, "--json").stdout)
    assert (run["name"], run["status"]) == ("kept", "completed")
    assert run["step"] == 32


def test_a_server_store_is_left_to_its_server(home: Path, tmp_path: Path) -> None:
    (tmp_path / "prudent.yaml").write_text(
        "store:\n  url: postgresql://user:secret@db.example:5432/prudent\n")
    result = prudent_cli(home, "store", "check")
    assert result.returncode == 2 and "pg_amcheck" in result.stderr
    assert "secret" not in result.stderr


def test_a_home_with_no_store_yet_is_not_damaged_and_a_deleted_one_is_rebuilt(home: Path) -> None:
    fresh = prudent_cli(home, "store", "check")
    assert fresh.returncode == 0 and "no run store yet" in fresh.stdout, fresh.stdout + fresh.stderr
    nothing = prudent_cli(home, "store", "repair")
    assert nothing.returncode == 0 and "nothing to repair" in nothing.stdout
    assert not (home / "prudent.db").exists()  # nothing written for nothing
    kept = train(home, "kept")
    (home / "prudent.db").unlink()  # deleted by hand, the records beside the checkpoints stay
    gone = json.loads(prudent_cli(home, "store", "check", "--json").stdout)
    assert not gone["exists"] and gone["runs_only_in_records"] == [kept]
    assert prudent_cli(home, "store", "repair").returncode == 0
    assert json.loads(prudent_cli(home, "show", kept, "--json").stdout)["status"] == "completed"
