"""prudent for PyTorch Lightning 2.x (``lightning`` or ``pytorch_lightning``)::

    from prudent.lightning import PrudentCallback

    prudent_cb = PrudentCallback(name="digits", config={"lr": 0.05, "max_epochs": 5})
    cfg = prudent_cb.config                       # after `prudent run --set` or the tuner
    model = LitNet(lr=cfg["lr"])
    trainer = L.Trainer(max_epochs=cfg["max_epochs"], callbacks=[prudent_cb])
    trainer.fit(model, train_dl, val_dl, ckpt_path=prudent_cb.resume_path())

The callback feeds the run from Lightning's hooks (loss at each optimizer step, gradients in
``on_before_optimizer_step``, validation metrics), and a stop (a rule, the budget, a
preemption notice or SIGTERM, the tuner's pruner) becomes a checkpoint, then
``trainer.should_stop``, then prudent's exit code once ``fit`` returns. Lightning's own
checkpoint (``trainer.save_checkpoint``) rides inside prudent's checkpoints, and
:func:`resume_path` gives it back to ``fit(ckpt_path=...)`` when the run resumes. The
Trainer's loggers (``TensorBoardLogger``, ``MLFlowLogger``, ``WandbLogger``, ``CSVLogger``) get
prudent's metrics (as ``prudent/<name>``), events and verdict in their own run, continued when
the run resumes (docs/trackers.md).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from prudent.adapters.core import AdapterRun
from prudent.adapters.loader import ResumableLoader, loader_length
from prudent.adapters.trackers import continue_lightning_loggers, lightning_logger_sinks
from prudent.checkpoint.deferred import DeferredFile
from prudent.kernel.optimizer_step import replace_next_step
from prudent.kernel.stop import ExitCode

__all__ = ["PrudentCallback", "ResumableLoader", "resumable", "resume_path"]


def _lightning() -> Any:
    """The Lightning the script uses: ``pytorch_lightning`` if only that one was imported."""
    if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules:
        import pytorch_lightning as pl

        return pl
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl
        except ImportError:
            raise ImportError("prudent.lightning needs Lightning: pip install 'prudent[lightning]'"
                              ) from None
    return pl


_pl = _lightning()
_NEVER = 2**62  # check_val_every_n_epoch that no epoch reaches
_CKPT_FILE = "lightning.ckpt"  # Lightning's checkpoint inside prudent's
_LATEST: dict[str, AdapterRun] = {}


class PrudentCallback(_pl.Callback):
    """A Lightning callback that makes ``trainer.fit`` a prudent run.

    Building it starts the run (``prudent.init(name, config, **init_kwargs)``), so
    :attr:`config` is known before the model is built. Keys of ``config`` that are also
    hyperparameters the module saved (``self.save_hyperparameters()``) are written into
    ``pl_module.hparams`` before ``configure_optimizers``; the module's other hyperparameters
    are added to the run's config (``prudent show`` lists them).
    """

    # Hooks Lightning calls at every step (or validation batch) that prudent does not use.
    # Lightning calls each callback's hooks through a profiler context (about 10 Python calls
    # each, measured: 64 of the 240 calls per step prudent added under Lightning), and skips a
    # hook that is not callable: two of the six per-step hooks cost nothing this way.
    on_after_backward = None  # type: ignore[assignment]
    on_before_zero_grad = None  # type: ignore[assignment]
    on_validation_batch_start = None  # type: ignore[assignment]
    on_validation_batch_end = None  # type: ignore[assignment]

    def __init__(self, name: str | None = None, config: dict[str, Any] | None = None, *,
                 exit_on_stop: bool = True, **init_kwargs: Any) -> None:
        super().__init__()
        self.adapter = AdapterRun("lightning", name, config, exit_on_stop=exit_on_stop,
                                  **init_kwargs)
        self.run = self.adapter.run
        self._loss: Any = None  # the step's loss, as on_before_backward got it
        self._stepped = False  # the optimizer stepped since the last batch end
        self._automatic = True  # the module's automatic_optimization
        self._planned_epochs: int | None = None  # max_epochs as the script asked for it
        self._planned_max_steps = -1  # max_steps as the script asked for it
        self._rollback: Any = None  # the monitor's rollback action (its batches to skip)
        self._drop = False  # the batch in progress is one a rollback skips: not trained
        self._dropping: list[int] | None = None  # a rollback's skip: [first step, batches]
        self._ctrl_c = _CtrlC()
        self._last_batch: int | None = None  # the epoch's last batch_idx (Lightning's limits)
        self._stop_at_epoch_end = False  # a stop that came at the epoch's last batch waits
        self._handed: list[Any] = []  # sinks whose rows the training thread hands to a logger
        _LATEST["run"] = self.adapter

    @property
    def config(self) -> dict[str, Any]:
        """The hyperparameters: ``config`` after ``prudent run --set`` or the tuner."""
        return self.adapter.config

    def resume_path(self) -> str | None:
        """Lightning's checkpoint to pass as ``trainer.fit(..., ckpt_path=...)`` (None: fresh)."""
        return self.adapter.resume_path

    # set-up ---------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        changed = self.adapter.merge_hparams(dict(getattr(pl_module, "hparams", {}) or {}))
        for key, value in changed.items():
            pl_module.hparams[key] = value  # read by configure_optimizers, which runs next
        self._planned_epochs = trainer.max_epochs
        self._planned_max_steps = trainer.max_steps
        if self.adapter.is_smoke:
            self._shorten(trainer)
        self.adapter.framework_checkpoint.bind(lambda folder: _save(trainer, folder),
                                               lambda: _save_in_memory(trainer),
                                               lambda path: _load_live(trainer, path))
        continue_lightning_loggers(trainer, self.adapter.ctx)
        self.adapter.use_trackers(lambda info: self._logger_sinks(trainer, info))
        if self.adapter.ctx.exit_on_stop:
            self._ctrl_c.install()
        # the generators as they were at the checkpoint, before Lightning draws the first
        # epoch's order (it restores no RNG itself)
        self.adapter.restore_rng()

    def _logger_sinks(self, trainer: Any, info: Any) -> list[Any]:
        sinks = lightning_logger_sinks(trainer, info)
        self._handed = [sink for sink in sinks if hasattr(sink, "deliver")]  # a CSVLogger's
        return sinks

    def _hand_over(self) -> None:
        """Rows the tracking thread left for a logger that only this thread may write to."""
        for sink in self._handed:
            sink.deliver()

    def _shorten(self, trainer: Any) -> None:
        """``prudent preflight``: two short epochs through Lightning's own limits (in overfit
        mode one batch an epoch, no validation: the probe rewinds the generators after each
        step, so each epoch draws the same order and its first batch again)."""
        micro = trainer.accumulate_grad_batches
        trainer.num_sanity_val_steps = 0
        if self.adapter.preflight_mode == "overfit":
            trainer.limit_train_batches = micro
            trainer.fit_loop.max_epochs = self.adapter.overfit_steps
            trainer.fit_loop.epoch_loop.max_steps = -1
            trainer.check_val_every_n_epoch = _NEVER
            return
        steps = self.adapter.smoke_steps or 8
        trainer.limit_train_batches = steps * micro
        trainer.limit_val_batches = min(_as_count(trainer.limit_val_batches), steps)
        trainer.fit_loop.max_epochs = min(trainer.max_epochs or 2, 2) if (
            trainer.max_epochs and trainer.max_epochs > 0) else 2
        trainer.fit_loop.epoch_loop.max_steps = -1

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = {f"optimizer{i or ''}": opt for i, opt in enumerate(trainer.optimizers)}
        # the schedulers too: a rule's reduce_lr scales their base learning rates as well, or
        # the next scheduler step would undo it
        schedulers = {f"scheduler{i or ''}": config.scheduler
                      for i, config in enumerate(getattr(trainer, "lr_scheduler_configs", []))}
        self.adapter.watch(model=pl_module, **optimizers, **schedulers)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._automatic = bool(pl_module.automatic_optimization)
        # the planned length the rules are sized to, in optimizer steps (max_steps and
        # accumulate_grad_batches count): Lightning's own estimate, or in a smoke run (whose
        # limits are shortened) the same worked out from what the script asked for
        self.adapter.ctx.state.num_steps = self._plan(trainer)
        self._rollback = self.adapter.rollback_skips()
        loaders = trainer.train_dataloader
        for loader in loaders.values() if isinstance(loaders, dict) else (
                loaders if isinstance(loaders, (list, tuple)) else [loaders]):
            if isinstance(loader, ResumableLoader):
                loader.position = lambda: self.adapter.ctx.state.batches_in_epoch
                # an epoch's batches as Lightning counts them (limit_train_batches)
                loader.epoch_length = lambda: _count(trainer.num_training_batches)

    def _plan(self, trainer: Any) -> int | None:
        if not self.adapter.is_smoke:
            steps = trainer.estimated_stepping_batches
            return int(steps) if 0 < steps < float("inf") else None
        planned = [self._planned_max_steps] if self._planned_max_steps > 0 else []
        batches = loader_length(trainer.train_dataloader)
        if batches and self._planned_epochs and self._planned_epochs > 0:
            micro = trainer.accumulate_grad_batches
            planned.append(self._planned_epochs * -(-batches // micro))
        return min(planned) if planned else None

    # the loop -------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        batches = trainer.num_training_batches
        self._last_batch = batches - 1 if isinstance(batches, int) else None
        if self.adapter.is_smoke:  # projections are of the run as planned, not the smoke run
            batches = loader_length(trainer.train_dataloader)
        self.adapter.epoch_start(trainer.current_epoch, self._planned_epochs,
                                 batches if isinstance(batches, int) else None)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        rollback = self._rollback
        if rollback is not None and rollback.take_skip():
            # a batch a rollback skips: Lightning draws and trains its own, so its gradients
            # are dropped (and an optimizer step made of such batches alone changes nothing)
            self._drop = True
            if self._dropping is None:
                self._dropping = [self.adapter.ctx.state.step + 1, 0]
            self._dropping[1] += 1
        self.adapter.batch_loaded(batch)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._loss = loss

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        # Lightning calls this hook exactly when it counts an optimizer step (global_step):
        # the flag tells on_train_batch_end so, without reading global_step's property chain
        self._stepped = True
        loss = self._loss
        if loss is not None:
            # backward has run: from here on the step's number is all anyone needs, and the
            # autograd graph goes when Lightning lets go of it (freed hot, in Lightning's step,
            # as without prudent; not a step later in a component that still held the loss)
            self._loss = loss = loss.detach()
        if self._drop:  # every batch of this step is one a rollback skips (one starts at a step)
            self._loss = None
            _drop_update(trainer, optimizer)
            return
        before = vars(optimizer).get("step")
        self.adapter.loss_ready(loss)
        if vars(optimizer).get("step") is not before:
            _skip_update_under_way(trainer, optimizer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._stepped:  # a micro-batch: no optimizer step yet
            if self._drop:
                self._drop = False
                pl_module.zero_grad(set_to_none=True)
            self.adapter.batch_end()
            return
        self._stepped = self._drop = False
        # Automatic optimization: the step's loss is the very tensor the gradient hooks got
        # (the value Lightning returns in outputs["loss"]): its number is read once for every
        # component (RunContext.host_scalar), and outputs is not looked into.
        loss = self._loss if self._automatic else _returned_loss(outputs)
        self._loss = None
        ctx = self.adapter.ctx
        metrics = {"loss": loss} if loss is not None else {}
        if batch_idx == self._last_batch and self.adapter.stop_pending() is not None:
            self._hold_stop_to_epoch_end(trainer, metrics)
            return
        ctx.epoch_end_follows = batch_idx == self._last_batch
        stop = self.adapter.step_done(metrics)
        ctx.epoch_end_follows = False
        if self._dropping is not None and not self._rollback.skip_left:
            self._dropped()
        if self._handed:
            self._hand_over()
        if stop is not None:
            self._stop_if(trainer, stop)

    def _hold_stop_to_epoch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """A stop (a preemption notice, a rule) at the epoch's last batch is taken at the
        epoch's end, as a periodic checkpoint there is: Lightning restarts from a checkpoint
        of an epoch's last step with the next epoch and without that epoch's validation,
        whose loader draws from the RNG (the next epoch's order would differ). Lightning's
        own SIGTERM handling would end fit before the epoch's end: it waits too."""
        self.adapter.count_step(metrics)
        self._stop_at_epoch_end = True
        if self._handed:
            self._hand_over()
        connector = getattr(trainer, "_signal_connector", None)
        if getattr(connector, "received_sigterm", False):
            connector.received_sigterm = False

    def _dropped(self) -> None:
        """A rollback's skip is done (or the fit ends in it): say what was not trained."""
        (first, batches), self._dropping = self._dropping, None
        self.adapter.batches_skipped(
            batches, first, max(first, self.adapter.ctx.state.step), "were drawn by Lightning "
            "(it draws its own data) and not trained: their gradients dropped, no update made "
            "from them", self._rollback.skip_left if self._rollback is not None else 0)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or self.adapter.stop is not None:
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items() if _scalar(v)}
        stop = self.adapter.log(take_stop=not self._stop_at_epoch_end, **metrics)
        self._stop_if(trainer, stop)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop_at_epoch_end = False
        self._stop_if(trainer, self.adapter.epoch_end(trainer.current_epoch))

    def _stop_if(self, trainer: Any, stop: Any) -> None:
        if stop is None or trainer.should_stop:
            return
        trainer.should_stop = True
        trainer.fit_loop.min_epochs = 0  # a stop is not early stopping: no minimum holds it
        trainer.fit_loop.epoch_loop.min_steps = 0
        # Lightning validates once more before it honours should_stop (for EarlyStopping): not
        # when the machine is going away or the weights are worthless
        trainer.check_val_every_n_epoch = _NEVER

    # the end --------------------------------------------------------------------------------
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self._dropping is not None:
            self._dropped()
        self._ctrl_c.uninstall()
        self.adapter.framework_checkpoint.bind(None)
        try:
            self.adapter.finish()
        finally:  # the trackers are closed: their last rows, before Lightning's finalize
            self._hand_over()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        try:
            self._ended_by(exception)
        finally:  # the trackers are closed: their last rows, before Lightning's finalize
            self._hand_over()

    def _ended_by(self, exception: BaseException) -> None:
        self._ctrl_c.uninstall()
        adapter = self.adapter
        if isinstance(exception, SystemExit) and not isinstance(exception, _Interrupted) \
                and not adapter.closed:
            # Lightning ends fit with SystemExit(None) (exit 0) after its own SIGTERM handler
            # fired, as a batch ends: at an epoch's last batch that is before the epoch's
            # end, where prudent's stop checkpoint waited. The stop is taken (and saved) while
            # Lightning's checkpoint is still bound: unbound first, the checkpoint held
            # prudent's counters and not Lightning's, and the resumed fit started over at
            # step 0. The process then says how the run ended (75, preempted).
            stop = adapter.take_stop()
            adapter.framework_checkpoint.bind(None)
            if stop is None:
                adapter.fail(exception)
                return
            adapter.ctx.finish("stopped", stop, stop.message)
            if adapter.ctx.exit_on_stop:
                exception.code = stop.exit_code
            return
        adapter.framework_checkpoint.bind(None)
        if adapter.closed:
            return
        if isinstance(exception, (_Interrupted, KeyboardInterrupt)):
            # as `with run:` does: a stop already requested (the stall watchdog interrupts
            # the main thread) wins over the Ctrl-C itself
            stop = adapter.interrupted()
            if isinstance(exception, _Interrupted):
                exception.code = stop.exit_code
            return
        adapter.fail(exception)


class _Interrupted(SystemExit):
    """Ctrl-C during ``fit``. Lightning turns a KeyboardInterrupt into ``sys.exit(1)``; raised
    as this SystemExit instead, it goes through Lightning's own clean-up (``on_exception``,
    teardown) and then ends the process with prudent's code (130, or the pending stop's)."""


class _CtrlC:
    """SIGINT raises :class:`_Interrupted` while ``fit`` runs, if the script left Python's
    default handler in place (a handler of its own is left alone); put back when fit ends."""

    def __init__(self) -> None:
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python only lets the main thread set handlers
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._handle)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._installed = False

    def _handle(self, _signum: int, _frame: Any) -> None:
        self.uninstall()  # a second Ctrl-C during the clean-up is a plain KeyboardInterrupt
        raise _Interrupted(ExitCode.INTERRUPTED.value)


def resumable(loader: Any) -> ResumableLoader:
    """The training loader, resumable mid-epoch batch for batch: with a plain ``DataLoader``
    Lightning restarts an interrupted epoch in a new order (see docs/lightning.md)::

        trainer.fit(model, prudent.lightning.resumable(train_loader), val_loader, ckpt_path=...)
    """
    return loader if isinstance(loader, ResumableLoader) else ResumableLoader(loader)


def resume_path() -> str | None:
    """The checkpoint of the run started by the newest :class:`PrudentCallback` (None:
    a fresh run): ``trainer.fit(model, ckpt_path=prudent.lightning.resume_path())``."""
    adapter = _LATEST.get("run")
    if adapter is None:
        raise RuntimeError("prudent.lightning.resume_path(): build the PrudentCallback first "
                           "(it starts the run and restores its checkpoint)")
    return adapter.resume_path


def _save(trainer: Any, folder: Path) -> Path:
    path = folder / _CKPT_FILE
    trainer.save_checkpoint(path, weights_only=False)
    return path


def _save_in_memory(trainer: Any) -> dict[str, Any] | None:
    """``trainer.save_checkpoint`` with the strategy's default ``TorchCheckpointIO`` (or
    Lightning's ``AsyncCheckpointIO`` around it) swapped, for this one call, for one that keeps
    the checkpoint it would write (the same bytes, serialised by prudent's writer thread): no
    file written and read back on the training thread, nor written by a thread of Lightning's
    after prudent read its folder. A CheckpointIO of the script's own (cloud, sharded
    strategies) is left to write its files (None: the caller falls back to them)."""
    strategy = trainer.strategy
    previous = strategy.checkpoint_io
    inner = (previous.checkpoint_io if isinstance(previous, _pl.plugins.AsyncCheckpointIO)
             else previous)
    if type(inner) is not _pl.plugins.TorchCheckpointIO and not (
            inner is None and isinstance(previous, _pl.plugins.AsyncCheckpointIO)):
        return None
    keep = _BytesCheckpointIO()
    strategy.checkpoint_io = keep
    try:
        trainer.save_checkpoint(_CKPT_FILE, weights_only=False)
    finally:
        strategy.checkpoint_io = previous
    return {_CKPT_FILE: keep.data} if keep.data is not None else None


def _load_live(trainer: Any, path: Path) -> None:
    """A checkpoint restored while ``fit`` runs (a rollback, early stopping's restore_best):
    the module's weights and the optimizers' and LR schedulers' states as they were then, in
    place, between two steps; Lightning's counters and loops go on (as a hand-written loop's
    do). Loaded with ``weights_only=True``, as Lightning loads its own checkpoints."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    trainer.lightning_module.load_state_dict(checkpoint["state_dict"])
    for optimizer, state in zip(trainer.optimizers, checkpoint.get("optimizer_states", [])):
        optimizer.load_state_dict(state)
    for config, state in zip(trainer.lr_scheduler_configs, checkpoint.get("lr_schedulers", [])):
        config.scheduler.load_state_dict(state)


class _BytesCheckpointIO(_pl.plugins.TorchCheckpointIO):  # type: ignore[misc]
    """Keeps the checkpoint Lightning would write: the dict, serialised by prudent's checkpoint
    writer on its thread, from host copies of its tensors (the training thread only copies)."""

    data: DeferredFile | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        self.data = DeferredFile(checkpoint)


def _returned_loss(outputs: Any) -> Any:
    """Manual optimization: the loss ``training_step`` returned, if any (detached)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss.detach() if hasattr(loss, "detach") else None


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) or (hasattr(value, "numel") and value.numel() == 1)


def _skip_update_under_way(trainer: Any, optimizer: Any) -> None:
    """A component made the optimizer's next ``step()`` a no-op (loss_spike's skip of an
    outlier's update) in this hook. Without a GradScaler Lightning runs the closure, and so this
    hook, inside ``optimizer.step(closure)``: the update being judged is already under way and
    the no-op would skip the next one instead. The step's gradients go (a torch optimizer
    leaves a parameter without a gradient alone: no update, no momentum or moments, no weight
    decay) and the no-op is used up now. With a GradScaler the closure runs first and
    ``scaler.step`` calls ``step()`` after this hook: the no-op skips this very update."""
    if getattr(trainer.precision_plugin, "scaler", None) is not None:
        return
    _drop_gradients(optimizer)
    optimizer.step()  # the no-op: it puts back what was there


def _drop_update(trainer: Any, optimizer: Any) -> None:
    """No update from this step's gradients: inside ``optimizer.step(closure)`` (no
    GradScaler) they go; with a GradScaler, whose ``scaler.step`` calls ``step()`` after this
    hook and needs the gradients it unscaled, the next ``step()`` is a no-op instead."""
    if getattr(trainer.precision_plugin, "scaler", None) is None:
        _drop_gradients(optimizer)
    else:
        replace_next_step(optimizer, "dropped")


def _drop_gradients(optimizer: Any) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None



def _count(batches: Any) -> int | None:
    return batches if isinstance(batches, int) else None  # inf: an endless loader


def _as_count(limit: Any) -> int:
    return limit if isinstance(limit, int) else 10**9
