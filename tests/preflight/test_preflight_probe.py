"""The probe inside a real (in-process) run in smoke mode: what it steers and what it records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import prudent
from prudent.preflight import PreflightProbe
from prudent.wiring.config import ProjectSettings


@pytest.fixture
def smoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: ProjectSettings) -> Path:
    out = tmp_path / "record.json"
    monkeypatch.setenv("PRUDENT_SMOKE", "1")
    monkeypatch.setenv("PRUDENT_PREFLIGHT_STEPS", "3")
    monkeypatch.setenv("PRUDENT_PREFLIGHT_OUT", str(out))
    return out


def loader(num_samples: int = 60, batch_size: int = 8) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_samples, 4, generator=generator)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=batch_size)


class Detached(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).detach())


def train(settings: ProjectSettings, model: torch.nn.Module, zero_grad: bool = True,
          epochs: int = 5) -> prudent.Run:
    run = prudent.init(name="probe", settings=settings, exit_on_stop=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(epochs):
            for x, y in run.batches(loader()):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                if zero_grad:
                    opt.zero_grad()
                run.step(loss=loss)
            with torch.no_grad():
                model.eval()
                model(torch.zeros(3, 4, dtype=torch.float32))
                model.train()
    return run


def test_smoke_mode_runs_two_short_epochs_and_reaches_the_last_batch(
        settings: ProjectSettings, smoke: Path) -> None:
    run = train(settings, torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                              torch.nn.Linear(8, 2)))
    assert any(isinstance(c, PreflightProbe) for c in run.context.components)
    record = json.loads(smoke.read_text())
    assert record["status"] == "completed" and record["num_epochs"] == 5
    assert [(s["epoch"], s["index"]) for s in record["steps"]] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert record["scan"] == {"batches": 5, "complete": True, "nonfinite": [],
                              "seconds": record["scan"]["seconds"]}
    last = [b for b in record["batches"] if b["last_of_epoch"]]
    assert last and last[0]["leaves"][0][1] == [4, 4]  # 60 samples: the last batch has 4
    assert record["batches_per_epoch"] == 8 and record["step_s"] > 0
    assert record["gradients"]["never"] == [] and record["gradients"]["stale"] == []
    assert set(record["model_inputs"]["model"]) == {"train", "eval"}
    assert record["memory"]["peak_rss_bytes"] > 0


def test_a_detached_layer_and_a_missing_zero_grad_are_recorded(
        settings: ProjectSettings, smoke: Path) -> None:
    train(settings, Detached(), zero_grad=False)
    gradients = json.loads(smoke.read_text())["gradients"]
    assert gradients["never"] == ["encoder.weight", "encoder.bias"]
    assert gradients["stale"] == ["head.bias", "head.weight"]


def test_overfit_mode_repeats_the_first_batch_until_the_loss_fell_tenfold(
        settings: ProjectSettings, smoke: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_PREFLIGHT_MODE", "overfit")
    monkeypatch.setenv("PRUDENT_PREFLIGHT_OVERFIT_STEPS", "200")
    seen: list[torch.Tensor] = []
    model = torch.nn.Linear(4, 2)
    run = prudent.init(name="overfit", settings=settings, exit_on_stop=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(5):
            for x, y in run.batches(loader()):
                seen.append(x)
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
    record = json.loads(smoke.read_text())
    assert record["status"] == "stopped" and record["stop_reason"] == "preflight"
    losses = [s["loss"] for s in record["steps"]]
    assert 10 <= len(losses) < 200 and all(torch.equal(x, seen[0]) for x in seen)
    assert losses[-1] <= losses[0] / 10 < min(losses[:-1])  # stopped at the first 10x fall


def test_the_probe_is_only_built_in_smoke_mode() -> None:
    assert PreflightProbe.build({}) is None
    assert PreflightProbe.build({"PRUDENT_SMOKE": "0"}) is None
    probe = PreflightProbe.build({"PRUDENT_SMOKE": "1", "PRUDENT_PREFLIGHT_STEPS": "5",
                                  "PRUDENT_PREFLIGHT_STOP_AT": "7"})
    assert probe is not None and (probe.settings.steps, probe.settings.stop_at) == (5, 7)


def iterations(settings: ProjectSettings, num_steps: int = 40, accum: int = 2,
               generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """A nanoGPT-style loop: run.steps, batches drawn with torch.randint, micro-steps."""
    data = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    targets = (data[:, 0] > 0).long()
    model = torch.nn.Linear(4, 2)
    run = prudent.init(name="iterations", settings=settings, exit_on_stop=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    run.attach(model=model, optimizer=opt)
    drawn = []
    with run:
        for _ in run.steps(num_steps):
            for _ in range(accum):
                ix = torch.randint(64, (8,), generator=generator)
                drawn.append(ix)
                run.backward(F.cross_entropy(model(data[ix]), targets[ix]) / accum)
            opt.step()
            opt.zero_grad()
            run.step()
    return drawn


def test_an_iteration_loop_is_shortened_timed_and_its_length_kept(
        settings: ProjectSettings, smoke: Path) -> None:
    iterations(settings, num_steps=500)
    record = json.loads(smoke.read_text())
    assert record["status"] == "completed" and len(record["steps"]) == 6  # 2 x --steps 3
    assert (record["num_steps"], record["num_epochs"], record["step_limit"]) == (500, None, 6)
    assert record["step_s"] > 0 and record["steps"][0]["time_s"] is None  # timed end to end
    assert len({s["rng"]["torch"] for s in record["steps"]}) == 6  # every step draws
    assert len({s["inputs"] for s in record["steps"]}) == 6  # and feeds the model new batches


def test_overfit_rewinds_the_generators_so_a_loop_that_draws_its_own_batches_repeats_them(
        settings: ProjectSettings, smoke: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_PREFLIGHT_MODE", "overfit")
    monkeypatch.setenv("PRUDENT_PREFLIGHT_OVERFIT_STEPS", "12")
    drawn = iterations(settings)
    assert all(torch.equal(ix, drawn[i % 2]) for i, ix in enumerate(drawn))  # 2 micro-batches
    record = json.loads(smoke.read_text())
    assert record["rewound"] and not record.get("loader_repeated")
    assert len({s["inputs"] for s in record["steps"]}) == 1 and len(record["steps"]) == 12


def test_overfit_cannot_rewind_a_generator_of_the_scripts_own(
        settings: ProjectSettings, smoke: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_PREFLIGHT_MODE", "overfit")
    monkeypatch.setenv("PRUDENT_PREFLIGHT_OVERFIT_STEPS", "12")
    iterations(settings, generator=torch.Generator().manual_seed(1))
    inputs = [s["inputs"] for s in json.loads(smoke.read_text())["steps"]]
    assert len(set(inputs)) == len(inputs) == 12  # the overfit check says SKIP on this


def test_a_loop_that_counts_its_own_iterations_is_stopped_after_the_smoke_steps(
        settings: ProjectSettings, smoke: Path) -> None:
    """``for it in range(max_iters)`` around run.step(): smoke mode cannot end the loop, so the
    probe stops it once the short run's steps are done (it would otherwise train in full)."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = prudent.init(name="own-counter", settings=settings, exit_on_stop=False)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in range(500):
            x = torch.randn(8, 4)
            run.backward(F.cross_entropy(model(x), (x[:, 0] > 0).long()))
            opt.step()
            opt.zero_grad()
            run.step()
    record = json.loads(smoke.read_text())
    assert run.state.step == 6 and run.status == "stopped" and record["stop_reason"] == "preflight"
    assert len(record["steps"]) == 6 and record["step_limit"] == 6
