"""A script that resumes from a checkpoint of its own (nanoGPT's init_from='resume') while
prudent runs it is told which resume counts, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import prudent
from prudent.testing import make_settings


def nanogpt_like(home: Path, own: Path | None, run_id: str, steps: int, monkeypatch: Any,
                 stop_at: int | None = None) -> Any:
    """nanoGPT's start: its own ckpt.pt loaded (init_from='resume') before the model is
    built, then prudent's loop."""
    monkeypatch.setenv("PRUDENT_RUN_ID", run_id)
    run = prudent.init(name="own", settings=make_settings(home, console={"mode": "plain"}),
                       exit_on_stop=False)
    model = torch.nn.Linear(2, 1)
    if own is not None:
        checkpoint = torch.load(own, map_location="cpu", weights_only=True)
        model.load_state_dict(checkpoint["model"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    with run:
        for step in run.steps(steps):
            loss = model(torch.ones(1, 2)).pow(2).sum()
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
            if stop_at is not None and step + 1 == stop_at:
                run.context.request_stop("preempted", "the test's notice")
    return run


@pytest.fixture
def own_checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "out" / "ckpt.pt"
    path.parent.mkdir()
    torch.save({"model": torch.nn.Linear(2, 1).state_dict(), "optimizer": {}, "iter_num": 350,
                "best_val_loss": 1.25}, path)
    return path


def events(run: Any) -> list[dict[str, Any]]:
    from prudent.store.database import Store

    store = Store(run.context.store.url)  # the run's end wrote and closed its rows
    try:
        return [e for e in store.events(run.context.id) if e["name"] == "script_resumed"]
    finally:
        store.close()


def test_a_script_resuming_itself_on_a_fresh_prudent_run_is_told_the_counter_restarts(
        home: Path, own_checkpoint: Path, monkeypatch: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = nanogpt_like(home, own_checkpoint, "fresh", 4, monkeypatch)
    err = capsys.readouterr().err
    assert f"the script resumed itself from {own_checkpoint} (iter_num 350)" in err
    assert "prudent counts this run from step 0" in err
    (event,) = events(run)
    assert event["payload"]["value"] == 350 and event["payload"]["prudent_step"] == 0
    assert torch.load is getattr(torch.load, "__wrapped__", torch.load)  # put back


def test_when_prudent_resumed_too_its_resume_wins_and_says_so(
        home: Path, own_checkpoint: Path, monkeypatch: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    nanogpt_like(home, None, "both", 10, monkeypatch, stop_at=6)
    capsys.readouterr()
    run = nanogpt_like(home, own_checkpoint, "both", 10, monkeypatch)
    err = capsys.readouterr().err
    assert "prudent resumed this run from its checkpoint at step 6" in err
    assert "(prudent's resume wins)" in err and len(events(run)) == 1


def test_pretrained_weights_and_prudents_own_files_are_not_a_resume(
        home: Path, tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]) -> None:
    weights = tmp_path / "pretrained.pt"
    torch.save(torch.nn.Linear(2, 1).state_dict(), weights)  # a bare state dict
    nanogpt_like(home, None, "plain", 10, monkeypatch, stop_at=6)  # prudent's own resume next
    run = prudent.init(name="own", settings=make_settings(home, console={"mode": "plain"}),
                       exit_on_stop=False)
    torch.load(weights, weights_only=True)
    restored = run.context.run_dir / "lightning" / "restored" / "last.ckpt"  # an adapter's
    restored.parent.mkdir(parents=True)  # framework checkpoint, restored by prudent itself
    torch.save({"state_dict": {}, "epoch": 3, "global_step": 300}, restored)
    torch.load(restored, weights_only=True)
    with run:
        for _ in run.steps(8):
            run.step()
    assert "script_resumed" not in capsys.readouterr().err + str(events(run))
