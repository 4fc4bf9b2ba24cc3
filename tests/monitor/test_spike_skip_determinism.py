"""loss_spike's skip steers training: which updates it skips must not depend on when the
monitor's checks fell (they are spaced by what they cost, so by the machine's speed), or two
runs of the same script differ and a resumed run is not the run that was never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import prudent
from prudent.store.database import Store
from prudent.testing import StopAtStep, make_settings, tiny_loader, tiny_model

# a heavy-tailed loss (each step's scaled by a log-normal factor): some steps sit near the
# skip threshold, so a threshold renewed a few steps sooner or later skips other updates
SCALES = torch.exp(1.2 * torch.randn(400, generator=torch.Generator().manual_seed(3))).tolist()
for _step in (157, 233, 318):  # and a few plain outliers: skipped in any case
    SCALES[_step - 1] *= 100


def noisy_run(tmp_path: Path, check_every: int, stop_at: int | None = None) -> dict[str, Any]:
    # (the scaled losses' gradients would make exploding_gradient stop the run: not its test)
    settings = make_settings(tmp_path, monitor={"check_every_steps": check_every,
                                                "max_check_every_steps": 50,
                                                "rules": {"exploding_gradient": {"enabled": False}}},
                             checkpoint={"every": "off"})
    torch.manual_seed(0)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = prudent.init(name="spikes", settings=settings, exit_on_stop=False)
    if stop_at:
        run.context.add_component(StopAtStep(stop_at))
    run.attach(model=model, optimizer=opt)
    loader = tiny_loader(num_samples=8 * 50, batch_size=8)
    with run:
        for _ in run.epochs(8):
            for x, y in run.batches(loader):
                step = run.state.step + 1
                loss = F.cross_entropy(model(x), y) * SCALES[step - 1]
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
    store = Store(f"sqlite:///{tmp_path / 'prudent.db'}")
    try:
        # each with its message: the mean and deviations its threshold was worked out from
        skipped = [(e["step"], e["message"]) for e in store.events(run.id)
                   if e["name"] == "skipped_update"]
    finally:
        store.close()
    return {"status": run.status, "step": run.state.step, "skipped": skipped,
            "model": model.state_dict()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_skipped_updates_do_not_depend_on_where_checks_fell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # checks every 10 steps and every 23: the threshold is renewed at the same grid steps
    monkeypatch.setenv("PRUDENT_RUN_ID", "often")
    often = noisy_run(tmp_path, check_every=10)
    monkeypatch.setenv("PRUDENT_RUN_ID", "seldom")
    seldom = noisy_run(tmp_path, check_every=23)
    assert often["skipped"] == seldom["skipped"]
    assert len(often["skipped"]) >= 3  # some updates were skipped at all
    assert same(often["model"], seldom["model"])


def test_a_run_resumed_between_checks_skips_the_same_updates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the checkpoint holds the threshold in force and the steps not yet checked: stopped at
    # step 245 (the last check at 240, the next grid step 250), resumed, it is the same run
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = noisy_run(tmp_path, check_every=10)
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    first = noisy_run(tmp_path, check_every=10, stop_at=245)
    assert (first["status"], first["step"]) == ("stopped", 245)
    resumed = noisy_run(tmp_path, check_every=10)
    assert (resumed["status"], resumed["step"]) == ("completed", reference["step"])
    assert resumed["skipped"] == reference["skipped"]
    assert same(reference["model"], resumed["model"])
