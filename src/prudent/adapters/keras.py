"""prudent for Keras 3 on the torch backend (``KERAS_BACKEND=torch``)::

    from prudent.keras import PrudentCallback

    prudent_cb = PrudentCallback(name="digits", config={"learning_rate": 0.05, "epochs": 5})
    cfg = prudent_cb.config                       # after `prudent run --set` or the tuner
    model.compile(optimizer=keras.optimizers.SGD(cfg["learning_rate"]), loss=...)
    model.fit(x, y, epochs=cfg["epochs"], validation_data=(xv, yv), callbacks=[prudent_cb])

The callback feeds the run from ``model.fit``'s hooks: the loss of every optimizer step (the
step's own loss, as it enters Keras' loss tracker, not the epoch's running mean Keras logs),
gradients just before the optimizer applies them (the model is a ``torch.nn.Module`` on the
torch backend, its parameters carry ``.grad``), validation metrics (``val_*``) at each epoch's
end. A stop (a rule, the budget, SIGTERM or a preemption notice, the tuner's pruner) becomes a
checkpoint, then ``model.stop_training = True``, then prudent's exit code once ``fit`` returns.

Keras' own checkpoint rides inside prudent's: the files ``keras.callbacks.BackupAndRestore``
writes (``latest.weights.h5``: the model's weights and the optimizer's state;
``training_metadata.json``: epoch and batch). A resumed run loads them in ``on_train_begin``
and starts ``fit`` at the interrupted epoch; the batches of that epoch already trained are
drawn in the same order again (the generators as they were at the epoch's start) and skipped
without a training step, then the generators are put back as they were at the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch  # Keras' torch backend has loaded it already

from prudent.adapters.core import AdapterRun

try:
    import keras
except ImportError:  # pragma: no cover - the message is the point
    raise ImportError("prudent.keras needs Keras 3: pip install 'prudent[keras]' and set "
                      "KERAS_BACKEND=torch") from None

__all__ = ["PrudentCallback"]

WEIGHTS = "latest.weights.h5"  # the names keras.callbacks.BackupAndRestore uses
METADATA = "training_metadata.json"


def _check_backend() -> None:
    backend = keras.backend.backend()
    if backend != "torch":
        raise RuntimeError(f"prudent.keras runs on Keras' torch backend, not {backend!r}: set "
                           "KERAS_BACKEND=torch before keras is imported")


class PrudentCallback(keras.callbacks.Callback):
    """A Keras callback that makes ``model.fit`` a prudent run.

    Building it starts the run (``prudent.init(name, config, **init_kwargs)``), so
    :attr:`config` is known before the model is built: read the hyperparameters from it.
    ``fit``'s own settings (epochs, batch size, steps per epoch) and the optimizer's learning
    rate join the run's config when ``fit`` starts (``prudent show`` lists them). Put it last in
    ``callbacks``: a stopped run's exit code is raised from its ``on_train_end``.
    """

    def __init__(self, name: str | None = None, config: dict[str, Any] | None = None, *,
                 exit_on_stop: bool = True, **init_kwargs: Any) -> None:
        _check_backend()
        super().__init__()
        self.adapter = AdapterRun("keras", name, config, exit_on_stop=exit_on_stop,
                                  **init_kwargs)
        self.run = self.adapter.run
        self._epoch = 0
        self._batch = 0  # batches of the epoch in progress trained (BackupAndRestore's count)
        self._epoch_rng: dict[str, Any] | None = None
        self._skip = 0  # batches of a resumed epoch to skip (trained before the interruption)
        self._after_skip_rng: dict[str, Any] | None = None
        self._tracker: Any = None
        self._update: Any = None
        self._step_loss: Any = None
        self._loss: Any = None
        self._apply: Any = None
        self._view: _KerasOptimizerView | None = None
        self._train_function: Any = None
        self._skipped = False
        self._smoke_steps: int | None = None  # under preflight: steps an epoch, two epochs
        self._rollback: Any = None  # the monitor's rollback action (its batches to skip)
        self._dropped = 0  # batches a rollback skipped so far (said once its skip is done)

    @property
    def config(self) -> dict[str, Any]:
        """The hyperparameters: ``config`` after ``prudent run --set`` or the tuner."""
        return self.adapter.config

    def resume_path(self) -> str | None:
        """The BackupAndRestore folder the run resumes from (None: a fresh run); the callback
        loads it itself."""
        return self.adapter.resume_path

    # set-up ---------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model, adapter = self.model, self.adapter
        params = self.params or {}
        hparams = {"epochs": params.get("epochs"), "steps_per_epoch": params.get("steps")}
        optimizer = model.optimizer
        if optimizer is not None:
            hparams["optimizer"] = type(optimizer).__name__
            lr = optimizer.learning_rate
            if isinstance(lr, keras.Variable):
                hparams["learning_rate"] = float(lr.value.detach().cpu())
        changed = adapter.merge_hparams({k: v for k, v in hparams.items() if v is not None})
        if "learning_rate" in changed and optimizer is not None:
            optimizer.learning_rate.assign(float(changed["learning_rate"]))
        tracker = next((m for m in model.metrics if m.name == "loss"), None)
        if tracker is not None:  # Keras' loss tracker: each step's loss passes through it
            self._tracker, self._update = tracker, tracker.update_state
            tracker.update_state = self._track_loss
        if optimizer is not None:
            self._apply = optimizer.apply
            optimizer.apply = self._before_apply  # gradients, before the optimizer steps
            self._view = _optimizer_view(optimizer, model)
        adapter.watch(model=model, optimizer=self._view)
        self._rollback = adapter.rollback_skips()
        self._train_function = model.train_function
        model.train_function = self._train_or_skip
        if adapter.is_smoke:
            self._smoke_steps = adapter.smoke_steps or 8
        adapter.framework_checkpoint.bind(self._save, load_live=self._load_live)
        if adapter.resume_path is not None:
            self._load(Path(adapter.resume_path))
        else:
            adapter.restore_rng()

    def _save(self, folder: Path) -> Path:
        """What BackupAndRestore would write now (weights with the optimizer's state, the
        epoch and the batches of it trained), plus the generators at the epoch's start."""
        target = folder / "backup"
        target.mkdir()
        self.model.save_weights(str(target / WEIGHTS))
        (target / METADATA).write_text(json.dumps({"epoch": self._epoch, "batch": self._batch}))
        if self._epoch_rng is not None:
            torch.save(self._epoch_rng, target / "epoch_rng.pt")
        return target

    def _load_live(self, folder: Path) -> None:
        """A checkpoint restored while ``fit`` runs (a rule's rollback, early stopping's best
        weights): the weights and the optimizer's state go into the live model between two
        steps (Keras assigns its variables in place); ``fit``'s epoch and batch go on."""
        self.model.load_weights(str(folder / WEIGHTS))

    def _load(self, folder: Path) -> None:
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(str(folder / WEIGHTS))
        meta = json.loads((folder / METADATA).read_text())
        model._initial_epoch = meta["epoch"]  # as BackupAndRestore does
        self._epoch = meta["epoch"]
        rng_file = folder / "epoch_rng.pt"
        if meta.get("batch") and rng_file.exists():
            self._skip = meta["batch"]
            self._epoch_rng = torch.load(rng_file, weights_only=True)
            self._after_skip_rng = self.adapter.ctx.resume_rng
            self.adapter.ctx.resume_rng = None
        else:
            self.adapter.restore_rng()

    # the loop -------------------------------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        from prudent.kernel.rng import capture_rng, restore_rng

        if self._skip and epoch == self._epoch and self._epoch_rng is not None:
            restore_rng(self._epoch_rng)  # the interrupted epoch's order, drawn again
        else:
            self._epoch_rng = capture_rng()
            self._skip = 0
        self._epoch, self._batch = epoch, 0
        params = self.params or {}
        self.adapter.epoch_start(epoch, params.get("epochs"), params.get("steps"))
        self.adapter.ctx.state.batches_in_epoch = self._skip

    def _train_or_skip(self, data: Any) -> Any:
        if self._skip:
            self._skip -= 1
            if not self._skip and self._after_skip_rng is not None:
                from prudent.kernel.rng import restore_rng

                restore_rng(self._after_skip_rng)  # dropout and the rest go on as they were
                self._after_skip_rng = None
            self._batch += 1
            self._skipped = True
            return {}
        if self._smoke_steps is not None and self._batch >= self._smoke_steps:
            self._skipped = True  # preflight's smoke run: the rest of the epoch is passed over
            return {}
        rollback = self._rollback
        if rollback is not None and rollback.take_skip():
            # a batch a rollback skips: Keras drew it, it is not trained (no step either, as
            # run.batches skips it), and the epoch's position moves past it
            self._batch += 1
            self.adapter.ctx.state.batches_in_epoch += 1
            self._skipped = True
            self._dropped += 1
            if not rollback.skip_left:
                self._say_dropped()
            return {}
        self._skipped = False
        self.adapter.batch_loaded(data)
        return self._train_function(data)

    def _before_apply(self, grads: Any, variables: Any = None) -> Any:
        loss, self._step_loss = self._step_loss, None
        if loss is not None and hasattr(loss, "detach"):
            # backward has run: the graph goes with Keras' step, as without prudent (freed
            # hot, not a step later in a component that still held the loss)
            loss = loss.detach()
        self._loss = loss
        self.adapter.loss_ready(loss)
        view = self._view
        if view is None or "step" not in vars(view):
            # straight to Keras: the view's step() goes through torch's step wrapper (a
            # profiler range and the hooks), 11.5 us a call, measured
            return self._apply(grads, variables)
        view.pending = (self._apply, grads, variables)
        return view.step()  # made a no-op for this one step by the monitor (a skip)

    def _track_loss(self, values: Any, sample_weight: Any = None) -> Any:
        """The loss tracker's update with this step's loss: kept as it is (Keras logs the
        epoch's running mean, in which one huge batch is diluted). Detached once backward has
        run (:meth:`_before_apply`); the gradient hooks and the step's metrics then get that one
        tensor, so its number is read once for every component (``RunContext.host_scalar``)."""
        self._step_loss = values
        return self._update(values, sample_weight=sample_weight)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._skipped or self.adapter.stop is not None:  # not trained: resumed or smoke
            return
        self._batch += 1
        loss = self._loss if self._loss is not None else (logs or {}).get("loss")
        self._loss = None
        stop = self.adapter.step_done({"loss": loss} if loss is not None else {})
        if stop is not None:
            self._stop_if(stop)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Nothing to do; defined so that Keras does not run evaluation callbacks on a thread
        pool: a stop ends the process from ``on_train_end``, before Keras shuts that pool."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.adapter.stop is not None:
            return
        # the epoch's training is done: a checkpoint from here on (one an evaluation asks
        # for, too) resumes at the next epoch, from the generators as they are now
        self._epoch, self._batch, self._epoch_rng = epoch + 1, 0, None
        evaluation = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if evaluation:
            self._stop_if(self.adapter.log(**evaluation))
        self._stop_if(self.adapter.epoch_end(epoch))
        if self._smoke_steps is not None and epoch >= 1:  # epochs 0 and 1, resumed or not
            self.model.stop_training = True  # preflight's smoke run: two short epochs

    def _stop_if(self, stop: Any) -> None:
        if stop is None or self.model.stop_training:
            return
        self.model.stop_training = True
        # Keras still validates the epoch it breaks off before fit returns: not when the
        # machine is going away or the weights are worthless (the stop's checkpoint is saved)
        self.model.evaluate = _no_evaluation

    # the end --------------------------------------------------------------------------------
    def _say_dropped(self) -> None:
        step, self._dropped, batches = self.adapter.ctx.state.step, 0, self._dropped
        self.adapter.batches_skipped(
            batches, step, step, "were skipped: drawn by Keras, not trained",
            self._rollback.skip_left if self._rollback is not None else 0)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._dropped:
            self._say_dropped()
        self._unhook()
        self.adapter.finish()

    def _unhook(self) -> None:
        self.adapter.framework_checkpoint.bind(None)
        model = self.model
        if self._apply is not None and model.optimizer is not None:
            del model.optimizer.apply
            self._apply = None
        self._view = None
        if self._tracker is not None:
            del self._tracker.update_state
            self._tracker = None
        if "evaluate" in vars(model):
            del model.evaluate
        if self._train_function is not None:
            model.train_function = self._train_function
            self._train_function = None


def _no_evaluation(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {}


def _optimizer_view(optimizer: Any, model: Any) -> _KerasOptimizerView | None:
    """The view prudent's components get of a Keras optimizer (None for a learning-rate
    schedule: its rate is computed at each step and cannot be scaled from outside)."""
    if not isinstance(optimizer.learning_rate, keras.Variable):
        return None
    params = [v.value for v in model.trainable_variables]
    return _KerasOptimizerView(optimizer, params) if params else None


class _LearningRateGroup(dict):  # type: ignore[type-arg]
    """A param group whose ``"lr"`` is the Keras optimizer's ``learning_rate`` variable: read
    from it, and written into it (``reduce_lr``, a rollback's ``lr_factor``).

    Read from the variable's torch tensor, held once: Keras assigns a learning rate in place
    (``assign``, the ``learning_rate`` setter, ``load_weights``, ``ReduceLROnPlateau``), and
    its ``optimizer.learning_rate.value`` costs ~17 Python calls a read (the monitor reads
    the rate at each rule check)."""

    def __init__(self, optimizer: Any, params: list[Any]) -> None:
        self.keras_optimizer = optimizer
        self._variable = optimizer.learning_rate
        self._rate = self._variable.value
        super().__init__(params=params, lr=float(self._rate))

    def __getitem__(self, key: str) -> Any:
        if key == "lr":
            return float(self._rate)
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "lr":
            self._variable.assign(float(value))
        super().__setitem__(key, value)


class _KerasOptimizerView(torch.optim.Optimizer):
    """A Keras optimizer as prudent's components see a torch one (Keras' is not a
    ``torch.optim.Optimizer``, even on the torch backend): one param group holding the model's
    parameters and a learning rate that writes through (:class:`_LearningRateGroup`), and a
    ``step()`` that applies the gradients Keras is about to apply. The callback calls it only
    when the monitor has replaced it for one step (its skip of an outlier update): otherwise
    Keras applies them directly. Not saved: Keras' own checkpoint holds the optimizer's state."""

    def __init__(self, optimizer: Any, params: list[Any]) -> None:
        self.pending: tuple[Any, Any, Any] | None = None  # (apply, grads, variables)
        super().__init__([_LearningRateGroup(optimizer, params)], {})

    def step(self, closure: Any = None) -> Any:
        if self.pending is None:
            return None
        (apply, grads, variables), self.pending = self.pending, None
        return apply(grads, variables)
