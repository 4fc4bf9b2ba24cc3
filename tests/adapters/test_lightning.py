"""prudent.lightning in this process: a checkpoint restored while Lightning trains (a rollback,
early stopping's best weights) changes the live model and optimizer, not only the next resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prudent.kernel.events import Component
from prudent.testing import make_settings, tiny_loader, tiny_model

L = pytest.importorskip("lightning")
# Lightning's own _pytree calls a torch API that torch deprecates (not ours to change)
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.`:FutureWarning")


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_model()

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class _RollBackAt(Component):
    """Remembers the weights and momentum at ``keep`` (the step a checkpoint is taken), and at
    ``restore`` asks the checkpointer for the newest checkpoint before ``keep + 1``."""

    name = "roll_back_at"

    def __init__(self, module: _Tiny, keep: int, restore: int) -> None:
        self.module, self.keep, self.restore = module, keep, restore
        self.kept: dict[str, torch.Tensor] = {}
        self.after: dict[str, torch.Tensor] = {}
        self.restored: Any = None

    def on_step_end(self, run: Any, metrics: dict[str, Any]) -> None:
        if run.state.step == self.keep:
            self.kept = self._state()
        if run.state.step == self.restore:
            self.restored = run.checkpoints.restore(run, before_step=self.keep + 1)
            self.after = self._state()

    def _state(self) -> dict[str, torch.Tensor]:
        optimizer = self.module.trainer.optimizers[0]
        state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        for i, param in enumerate(self.module.parameters()):
            state[f"momentum{i}"] = optimizer.state[param]["momentum_buffer"].clone()
        return state


@pytest.mark.parametrize("io", ["default", "async"])
def test_a_rollback_during_fit_puts_the_live_weights_and_optimizer_back(tmp_path: Path,
                                                                        io: str) -> None:
    # with the script's AsyncCheckpointIO, Lightning's file was written in its thread, after
    # prudent had read (and removed) the scratch folder it was to be written in
    from lightning.pytorch.plugins import AsyncCheckpointIO

    from prudent.lightning import PrudentCallback

    settings = make_settings(tmp_path, checkpoint={"every": "5steps", "at_epoch_end": False})
    cb = PrudentCallback("roll", {}, exit_on_stop=False, settings=settings)
    module = _Tiny()
    probe = _RollBackAt(module, keep=5, restore=8)
    cb.adapter.ctx.add_component(probe)
    trainer = L.Trainer(max_steps=12, callbacks=[cb], accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        plugins=[AsyncCheckpointIO()] if io == "async" else None)
    trainer.fit(module, tiny_loader(num_samples=64, batch_size=8))

    assert probe.restored is not None and probe.restored[1] == 5
    assert probe.kept.keys() == probe.after.keys()
    for key, kept in probe.kept.items():
        assert torch.equal(kept, probe.after[key]), key  # the live objects, not only a file
    assert trainer.global_step == 12 and cb.run.stop_reason is None  # fit went on to the end


class _Seen(Component):
    """The loss each per-step event hands the components, and the step it is counted as."""

    name = "seen"

    def __init__(self) -> None:
        self.backward: list[float] = []
        self.steps: list[tuple[int, float]] = []

    def on_after_backward(self, run: Any, loss: Any) -> None:
        self.backward.append(run.host_scalar(loss))  # as the components read it

    def on_step_end(self, run: Any, metrics: dict[str, Any]) -> None:
        self.steps.append((run.state.step, run.host_scalar(metrics["loss"])))


class _Recording(_Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        loss = super().training_step(batch, idx)
        self.losses.append(loss.item())
        return loss


class _Manual(_Recording):
    """Manual optimization, stepping every second batch (the script's own accumulation)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        loss = super().training_step(batch, idx)
        self.manual_backward(loss)
        if idx % 2 == 1:
            optimizer = self.optimizers()
            optimizer.step()
            optimizer.zero_grad()
        return loss


@pytest.mark.parametrize("manual", [False, True], ids=["accumulate_grad_batches", "manual"])
def test_each_optimizer_step_is_one_step_with_its_loss_before_and_after_the_update(
        tmp_path: Path, manual: bool) -> None:
    from prudent.lightning import PrudentCallback

    cb = PrudentCallback("steps", {}, exit_on_stop=False, settings=make_settings(tmp_path))
    seen = _Seen()
    cb.adapter.ctx.add_component(seen)
    module = _Manual() if manual else _Recording()
    trainer = L.Trainer(max_steps=6, callbacks=[cb], accelerator="cpu", logger=False,
                        accumulate_grad_batches=1 if manual else 2, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, tiny_loader(num_samples=96, batch_size=8))

    # two batches an optimizer step: each step's loss is its second batch's (Lightning divides
    # an accumulated loss by the number of batches, as it hands it to backward)
    expected = [loss / (1 if manual else 2) for loss in module.losses[1::2]]
    assert trainer.global_step == 6 and [step for step, _ in seen.steps] == [1, 2, 3, 4, 5, 6]
    assert [loss for _, loss in seen.steps] == pytest.approx(expected, rel=1e-6)
    assert seen.backward == pytest.approx(expected, rel=1e-6)  # the rules saw it before the update


@pytest.mark.parametrize(("limits", "planned"), [
    ({"max_steps": 30, "max_epochs": 10}, 30),  # max_steps ends the fit first: 10 x 8 is 80
    ({"max_epochs": 3}, 24),  # 3 epochs of 16 batches, 2 per optimizer step
])
def test_the_rules_are_sized_to_the_optimizer_steps_lightning_plans(
        tmp_path: Path, limits: dict[str, Any], planned: int) -> None:
    # the monitor sizes its rules' windows to the run's planned length, in optimizer steps:
    # max_steps and accumulate_grad_batches count (trainer.estimated_stepping_batches)
    from prudent.lightning import PrudentCallback

    cb = PrudentCallback("plan", {}, exit_on_stop=False, settings=make_settings(tmp_path))
    monitor = next(c for c in cb.adapter.ctx.components if type(c).__name__ == "Monitor")
    trainer = L.Trainer(accumulate_grad_batches=2, callbacks=[cb], accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **limits)
    trainer.fit(_Tiny(), tiny_loader(num_samples=128, batch_size=8))

    assert trainer.estimated_stepping_batches == planned
    assert monitor._fitted_for == planned and cb.run.context.state.num_steps == planned


class _Spiky(_Tiny):
    """The loss of batch ``spike_at`` (0-based, one per optimizer step) is 1000x larger."""

    spike_at = 40

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        loss = super().training_step(batch, idx)
        return loss * 1000.0 if self.global_step == self.spike_at else loss


class _Weights(Component):
    name = "weights"

    def __init__(self, module: _Tiny) -> None:
        self.module = module
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, run: Any, metrics: dict[str, Any]) -> None:
        optimizer = self.module.trainer.optimizers[0]
        state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        for i, param in enumerate(self.module.parameters()):
            state[f"momentum{i}"] = optimizer.state[param]["momentum_buffer"].clone()
        self.at[run.state.step] = state


def test_loss_spikes_skip_leaves_the_outliers_update_out_not_the_next_ones(
        tmp_path: Path) -> None:
    # Lightning calls on_before_optimizer_step inside optimizer.step(closure): the update of
    # the step being judged is already under way when the monitor's skip makes step() a no-op
    from prudent.lightning import PrudentCallback

    settings = make_settings(tmp_path, monitor={"check_every_steps": 1,
                                                "rules": {"vanishing_gradient": {"enabled": False}}})
    cb = PrudentCallback("skip", {}, exit_on_stop=False, settings=settings)
    module = _Spiky()
    weights = _Weights(module)
    cb.adapter.ctx.add_component(weights)
    trainer = L.Trainer(max_steps=44, callbacks=[cb], accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, tiny_loader(num_samples=512, batch_size=8))

    skipped = [e for e in cb.adapter.ctx.store.events(cb.run.id)
               if (e["kind"], e["name"]) == ("monitor", "skipped_update")]
    assert [e["step"] for e in skipped] == [41]  # prudent counts from 1: global_step 40
    before, at, after = weights.at[40], weights.at[41], weights.at[42]
    for key, value in before.items():  # the outlier's step changed nothing
        assert torch.equal(value, at[key]), key
    assert not torch.equal(at["net.0.weight"], after["net.0.weight"])  # the next one updates
    assert trainer.global_step == 44 and cb.run.stop_reason is None


class _RollbackThenWeights(_Weights):
    """The monitor's own rollback action at ``step`` (as loss_spike runs it), then the weights
    and momentum of every step."""

    def __init__(self, module: _Tiny, monitor: Any, step: int) -> None:
        super().__init__(module)
        self.monitor, self.step = monitor, step
        self.message = ""

    def on_step_end(self, run: Any, metrics: dict[str, Any]) -> None:
        from prudent.monitor.actions import Firing
        from prudent.monitor.base import Finding

        if run.state.step == self.step:
            finding = Finding(self.step, 9.0, 2.0, "a spike", since=self.step - 1)
            self.message = self.monitor.actions["rollback"].apply(
                run, Firing("loss_spike", finding, self.step))
        super().on_step_end(run, metrics)


@pytest.mark.parametrize(("accumulate", "untouched"), [(1, 3), (2, 1)])
def test_a_rollback_trains_none_of_the_batches_it_skips(
        tmp_path: Path, accumulate: int, untouched: int) -> None:
    from prudent.lightning import PrudentCallback

    settings = make_settings(tmp_path, checkpoint={"every": "5steps", "at_epoch_end": False},
                             monitor={"actions": {"rollback": {"skip_batches": 3}}})
    cb = PrudentCallback("skip", {}, exit_on_stop=False, settings=settings)
    monitor = next(c for c in cb.adapter.ctx.components if type(c).__name__ == "Monitor")
    module = _Tiny()
    probe = _RollbackThenWeights(module, monitor, step=8)
    cb.adapter.ctx.add_component(probe)
    trainer = L.Trainer(max_steps=14, accumulate_grad_batches=accumulate, callbacks=[cb],
                        accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, tiny_loader(num_samples=512, batch_size=8))

    assert "back to step 5" in probe.message and "skipping the next 3 batches" in probe.message
    for step in range(9, 9 + untouched):  # weights and momentum as rolled back
        for key, value in probe.at[8].items():
            assert torch.equal(value, probe.at[step][key]), (step, key)
    assert not torch.equal(probe.at[8 + untouched]["net.0.weight"],
                           probe.at[9 + untouched]["net.0.weight"])
    skipped = [e for e in cb.adapter.ctx.store.events(cb.run.id)
               if (e["kind"], e["name"]) == ("monitor", "skipped_update")]
    assert [(e["payload"]["reason"], e["payload"]["batches"], e["payload"]["first_step"],
             e["payload"]["last_step"]) for e in skipped] == [
        ("rollback", 3, 9, 8 + -(-3 // accumulate))]
    assert trainer.global_step == 14 and cb.run.stop_reason is None
