"""prudent.keras in this process: a real model.fit on Keras' torch backend, stopped by the run,
leaves Keras' own BackupAndRestore checkpoint inside prudent's."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from prudent.checkpoint.storage import LocalStorage
from prudent.checkpoint.writer import load_latest
from prudent.kernel.events import Component
from prudent.testing import StopAtStep, make_settings

if importlib.util.find_spec("keras") is None:
    pytest.skip("keras is not installed: pip install 'prudent[keras]'", allow_module_level=True)
# imported while the tests are collected: keras sets environment variables of its own
os.environ.setdefault("KERAS_BACKEND", "torch")
import keras  # noqa: E402

if keras.backend.backend() != "torch":
    pytest.skip("keras was imported on another backend in this process", allow_module_level=True)


def _numpy(variable) -> np.ndarray:
    return variable.value.detach().cpu().numpy()


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def test_a_stop_checkpoints_what_backup_and_restore_reads_then_stops_fit_with_exit_75(
        tmp_path: Path) -> None:
    from prudent.keras import PrudentCallback

    settings = make_settings(tmp_path, console={"mode": "off"})
    cb = PrudentCallback("toy", {"learning_rate": 0.05}, settings=settings)
    cb.adapter.ctx.add_component(StopAtStep(5))
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model = _model()
    evaluations = []

    class Evaluations(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            evaluations.append(1)

    with pytest.raises(SystemExit) as exited:
        model.fit(x, x[:, :1], epochs=3, batch_size=8, verbose=0, validation_data=(x, x[:, :1]),
                  callbacks=[Evaluations(), cb])
    assert exited.value.code == 75 and cb.run.stop_reason == "preempted"
    assert not evaluations  # the broken-off epoch is not validated after the stop
    assert "evaluate" not in vars(model)  # the model is as it was
    assert int(_numpy(model.optimizer.iterations)) == 5  # stopped at once
    # the config took fit's settings; the run's learning rate reached the optimizer
    assert cb.config["epochs"] == 3 and cb.config["steps_per_epoch"] == 8
    assert float(_numpy(model.optimizer.learning_rate)) == \
        pytest.approx(0.05)

    backup = _backup(cb, tmp_path / "backup")
    meta = json.loads((backup / "training_metadata.json").read_text())
    assert meta == {"epoch": 0, "batch": 5}
    # Keras' own BackupAndRestore takes the folder: weights and the optimizer's state
    fresh = _model()
    restore = keras.callbacks.BackupAndRestore(str(backup))
    restore.set_model(fresh)
    restore.on_train_begin()
    for a, b in zip(model.weights + model.optimizer.variables,
                    fresh.weights + fresh.optimizer.variables, strict=True):
        np.testing.assert_array_equal(_numpy(a), _numpy(b))


class StopAtFirstEvaluation(Component):
    name = "stop_at_first_evaluation"

    def on_log(self, ctx, metrics) -> None:
        ctx.request_stop("preempted", "stopping at the first evaluation")


def test_a_checkpoint_at_an_epochs_evaluation_resumes_at_the_next_epoch(tmp_path: Path) -> None:
    from prudent.keras import PrudentCallback

    cb = PrudentCallback("toy", {}, settings=make_settings(tmp_path, console={"mode": "off"}))
    cb.adapter.ctx.add_component(StopAtFirstEvaluation())
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model = _model()
    with pytest.raises(SystemExit) as exited:
        model.fit(x, x[:, :1], epochs=3, batch_size=8, verbose=0,
                  validation_data=(x, x[:, :1]), callbacks=[cb])
    assert exited.value.code == 75 and int(_numpy(model.optimizer.iterations)) == 8
    backup = _backup(cb, tmp_path / "backup")
    # the first epoch was trained whole: not trained again on resume
    assert json.loads((backup / "training_metadata.json").read_text()) == {"epoch": 1, "batch": 0}


def _backup(cb, folder: Path) -> Path:
    """The BackupAndRestore folder carried in the run's newest checkpoint, written out."""
    checkpoint = load_latest(LocalStorage(cb.adapter.ctx.run_dir / "checkpoints"))
    assert checkpoint is not None and checkpoint.payload
    carried = next(v for v in _walk(checkpoint.payload) if "entry" in v)
    for name, data in carried["files"].items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.numpy().tobytes())
    return folder / carried["entry"]


def _walk(value):
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _walk(item)


class _RollBackAt(Component):
    """Remembers the weights and the optimizer's variables at ``keep`` (the step a checkpoint
    is taken), and at ``restore`` asks the checkpointer for the newest one before ``keep + 1``."""

    name = "roll_back_at"

    def __init__(self, model, keep: int, restore: int) -> None:
        self.model, self.keep, self.restore = model, keep, restore
        self.kept: list[np.ndarray] = []
        self.after: list[np.ndarray] = []
        self.restored = None

    def on_step_end(self, run, metrics) -> None:
        if run.state.step == self.keep:
            self.kept = self._state()
        if run.state.step == self.restore:
            self.restored = run.checkpoints.restore(run, before_step=self.keep + 1)
            self.after = self._state()

    def _state(self) -> list[np.ndarray]:
        return [_numpy(v).copy() for v in [*self.model.weights, *self.model.optimizer.variables]]


def test_a_rollback_during_fit_puts_the_live_weights_and_optimizer_back(tmp_path: Path) -> None:
    from prudent.keras import PrudentCallback

    settings = make_settings(tmp_path, console={"mode": "off"},
                             checkpoint={"every": "5steps", "at_epoch_end": False})
    cb = PrudentCallback("roll", {}, exit_on_stop=False, settings=settings)
    model = _model()
    probe = _RollBackAt(model, keep=5, restore=8)
    cb.adapter.ctx.add_component(probe)
    x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
    model.fit(x, x[:, :1], epochs=1, batch_size=8, verbose=0, callbacks=[cb])

    assert probe.restored is not None and probe.restored[1] == 5
    assert len(probe.kept) == len(probe.after) > len(model.weights)  # Adam's moments too
    for kept, after in zip(probe.kept, probe.after):
        np.testing.assert_array_equal(kept, after)  # the live model, not only a file
    assert int(_numpy(model.optimizer.iterations)) == 12 - 3  # fit went on after step 8
    assert cb.run.stop_reason is None


class _ActAt(Component):
    """At ``step``, the monitor's own ``reduce_lr`` action (the objects the adapter showed it)
    and a one-step no-op ``step()`` on every torch optimizer it saw, as its skip does."""

    name = "act_at"

    def __init__(self, monitor, model, step: int) -> None:
        self.monitor, self.model, self.step = monitor, model, step
        self.message = ""
        self.optimizers: list = []
        self.before: list[np.ndarray] = []
        self.after: list[np.ndarray] = []

    def on_attach(self, run, objects) -> None:
        import torch

        self.optimizers += [o for o in objects.values() if isinstance(o, torch.optim.Optimizer)]

    def on_step_end(self, run, metrics) -> None:
        from prudent.monitor.actions import Firing
        from prudent.monitor.base import Finding

        if run.state.step == self.step:
            finding = Finding(self.step, None, None, "a test asks for it")
            self.message = self.monitor.actions["reduce_lr"].apply(
                run, Firing("test", finding, self.step))
            for optimizer in self.optimizers:
                optimizer.step = lambda *args, _o=optimizer, **kwargs: vars(_o).pop("step")
            self.before = [_numpy(v).copy() for v in self.model.trainable_variables]
        if run.state.step == self.step + 1:
            self.after = [_numpy(v).copy() for v in self.model.trainable_variables]


def test_reduce_lr_and_a_skipped_update_reach_the_keras_optimizer(tmp_path: Path) -> None:
    from prudent.keras import PrudentCallback

    settings = make_settings(tmp_path, console={"mode": "off"})
    cb = PrudentCallback("lr", {}, exit_on_stop=False, settings=settings)
    model = _model()  # Adam(0.01)
    monitor = next(c for c in cb.adapter.ctx.components if type(c).__name__ == "Monitor")
    probe = _ActAt(monitor, model, step=4)
    cb.adapter.ctx.add_component(probe)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model.fit(x, x[:, :1], epochs=1, batch_size=8, verbose=0, callbacks=[cb])

    assert probe.message == "learning rate 0.01 -> 0.005"
    assert float(_numpy(model.optimizer.learning_rate)) == pytest.approx(0.005)
    assert len(probe.optimizers) == 1  # the Keras optimizer, as the components see it
    for before, after in zip(probe.before, probe.after):  # step 5's update was skipped
        np.testing.assert_array_equal(before, after)
    assert int(_numpy(model.optimizer.iterations)) == 8 - 1  # 8 steps, one update skipped


class _Rates(Component):
    """The learning rate each step's components read from the optimizer the adapter showed."""

    name = "rates"

    def __init__(self) -> None:
        self.optimizers: list = []
        self.rates: list[float] = []

    def on_attach(self, run, objects) -> None:
        import torch

        self.optimizers += [o for o in objects.values() if isinstance(o, torch.optim.Optimizer)]

    def on_step_end(self, run, metrics) -> None:
        self.rates.append(self.optimizers[0].param_groups[0]["lr"])


def test_the_components_read_the_learning_rate_keras_itself_changes(tmp_path: Path) -> None:
    from prudent.keras import PrudentCallback

    settings = make_settings(tmp_path, console={"mode": "off"})
    cb = PrudentCallback("rates", {}, exit_on_stop=False, settings=settings)
    rates = _Rates()
    cb.adapter.ctx.add_component(rates)
    model = _model()  # Adam(0.01)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.02 * (epoch + 1))
    model.fit(x, x[:, :1], epochs=2, batch_size=8, verbose=0, callbacks=[schedule, cb])

    assert rates.rates == pytest.approx([0.02] * 4 + [0.04] * 4)  # the setter, each epoch
    rates.optimizers[0].param_groups[0]["lr"] = 0.005  # as reduce_lr writes it
    assert float(_numpy(model.optimizer.learning_rate)) == pytest.approx(0.005)
    assert rates.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.005)


class _Rollback(Component):
    """The monitor's own rollback action at ``step``, as loss_spike runs it; the weights and
    the optimizer's variables of every step."""

    name = "rollback_at"

    def __init__(self, monitor, model, step: int) -> None:
        self.monitor, self.model, self.step = monitor, model, step
        self.message = ""
        self.states: dict[int, list[np.ndarray]] = {}

    def on_step_end(self, run, metrics) -> None:
        from prudent.monitor.actions import Firing
        from prudent.monitor.base import Finding

        if run.state.step == self.step:
            finding = Finding(self.step, 9.0, 2.0, "a spike", since=self.step - 1)
            self.message = self.monitor.actions["rollback"].apply(
                run, Firing("loss_spike", finding, self.step))
        self.states[run.state.step] = [
            _numpy(v).copy() for v in [*self.model.weights, *self.model.optimizer.variables]]


def test_a_rollback_skips_its_batches_under_fit(tmp_path: Path) -> None:
    from prudent.keras import PrudentCallback

    settings = make_settings(tmp_path, console={"mode": "off"},
                             checkpoint={"every": "5steps", "at_epoch_end": False},
                             monitor={"actions": {"rollback": {"skip_batches": 3}}})
    cb = PrudentCallback("skip", {}, exit_on_stop=False, settings=settings)
    model = _model()
    monitor = next(c for c in cb.adapter.ctx.components if type(c).__name__ == "Monitor")
    probe = _Rollback(monitor, model, step=8)
    cb.adapter.ctx.add_component(probe)
    x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
    model.fit(x, x[:, :1], epochs=1, batch_size=8, verbose=0, callbacks=[cb])  # 12 batches

    assert "back to step 5" in probe.message and "skipping the next 3 batches" in probe.message
    # batches 9-11 are skipped: the 12th is trained as step 9, from step 5's weights
    assert cb.run.context.state.step == 9 and max(probe.states) == 9
    assert int(_numpy(model.optimizer.iterations)) == 5 + 1
    skipped = [e for e in cb.adapter.ctx.store.events(cb.run.id)
               if (e["kind"], e["name"]) == ("monitor", "skipped_update")]
    assert [(e["payload"]["reason"], e["payload"]["batches"], e["step"]) for e in skipped] == [
        ("rollback", 3, 8)]
    assert cb.run.stop_reason is None
