"""prudent for the Hugging Face ``Trainer`` (transformers)::

    from prudent.transformers import PrudentCallback

    prudent_cb = PrudentCallback(name="tiny-bert", config={"learning_rate": 5e-4,
                                                           "num_train_epochs": 3})
    args = TrainingArguments(output_dir="out", **prudent_cb.config)   # or pick the keys
    trainer = Trainer(model=model, args=args, train_dataset=..., callbacks=[prudent_cb])
    trainer.train(resume_from_checkpoint=prudent_cb.resume_path())

The loss of every optimizer step is read from the model's own output (a forward hook), not
from the Trainer's logs: ``logging_nan_inf_filter`` replaces a NaN loss there by an average,
and the rules must see it. Gradients are measured in ``on_pre_optimizer_step`` (after
clipping), evaluation metrics arrive through ``on_evaluate``. A stop asks the Trainer for a
checkpoint (``control.should_save``) and to stop (``control.should_training_stop``); once its
checkpoint folder is written (``on_save``) prudent's checkpoint takes it along, and when
``train()`` returns the process exits with prudent's code.

Each prudent checkpoint taken between the Trainer's own saves is a complete Trainer checkpoint
folder of its step (``live/``: ``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``,
``scaler.pt`` under a GradScaler, ``rng_state.pth``, ``trainer_state.json``: the files and
contents ``Trainer._save_checkpoint`` writes), made in memory on the training thread. A run
whose machine vanished resumes from it (``resume_path()``), whatever the ``save_strategy``:
on a spot VM the Trainer's own folders die with the disk. A checkpoint restored while
``train()`` runs (a rule's ``rollback``, early stopping's ``restore_best``) is loaded into the
Trainer's live model, optimizer and LR scheduler between two steps; the Trainer's counters go
on.

A rollback's ``skip_batches`` cannot keep batches from the Trainer, which draws its own: the
callback drops them instead. The next ``skip_batches`` micro-batches are drawn and run forward
and backward, but their gradients are zeroed, an optimizer step made of them alone is a no-op
(as loss_spike's skip makes it; the LR scheduler still steps), and their losses reach no rule.
The Trainer's ``global_step`` is not rewound to the checkpoint's (so after a rollback of k
steps the schedule ends k steps short): ``train()`` fixes its epochs and steps per epoch before
it starts, so a rewind of k steps buys at most ``epochs x steps per epoch - max_steps`` more
steps (none when training by epochs; the data runs out first), and a resume derives the data
position from ``global_step``: it would train k batches again.

The Trainer's ``report_to`` trackers get prudent's metrics (as ``prudent/<name>``), events and
verdict in their own run: the W&B run and MLflow run its callbacks started, and, for
TensorBoard, an event file of prudent's own in its writer's run folder (docs/trackers.md). A
resumed ``train()`` writes on in the first attempt's runs and folder, not in new ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from prudent.adapters.core import AdapterRun
from prudent.adapters.files import folder_files, torch_bytes
from prudent.adapters.trackers import (
    continue_trainer_reporters,
    keep_trainer_reporters,
    trackers_follow,
    trainer_reporter_sinks,
)
from prudent.checkpoint.deferred import DeferredFile
from prudent.kernel.optimizer_step import put_back_step, replace_next_step
from prudent.kernel.stop import StopKind

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - the message is the point
    raise ImportError("prudent.transformers needs transformers: pip install "
                      "'prudent[transformers]'") from None

__all__ = ["HPARAMS", "PrudentCallback"]

# the TrainingArguments fields that join run.config (and that --set / the tuner may change)
HPARAMS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
           "gradient_accumulation_steps", "weight_decay", "warmup_steps", "max_grad_norm",
           "lr_scheduler_type", "seed", "adam_beta1", "adam_beta2", "adam_epsilon")

LIVE = "live"  # a Trainer folder of a prudent checkpoint's step, when the Trainer wrote none
WEIGHTS, WEIGHTS_BIN = "model.safetensors", "pytorch_model.bin"  # the Trainer's file names
OPTIMIZER, SCHEDULER, SCALER = "optimizer.pt", "scheduler.pt", "scaler.pt"
TRAINER_STATE = "trainer_state.json"


class PrudentCallback(TrainerCallback):
    """A ``TrainerCallback`` that makes ``trainer.train()`` a prudent run.

    Building it starts the run (``prudent.init(name, config, **init_kwargs)``). Keys of
    ``config`` named like a field of :data:`HPARAMS` are written into the ``TrainingArguments``
    when the Trainer is built (before its optimizer is); the other fields listed there join
    the run's config.
    """

    def __init__(self, name: str | None = None, config: dict[str, Any] | None = None, *,
                 exit_on_stop: bool = True, **init_kwargs: Any) -> None:
        self.adapter = AdapterRun("transformers", name, config, exit_on_stop=exit_on_stop,
                                  **init_kwargs)
        self.run = self.adapter.run
        self._loss: Any = None
        self._in_step = False  # a training forward of this optimizer step was seen
        self._hooks: list[Any] = []
        self._output_dir: Path | None = None
        self._saving_to_stop = False
        self._epoch_done: int | None = None  # ended, but the Trainer has yet to evaluate it
        self._written: Path | None = None  # the newest checkpoint folder the Trainer wrote
        self._written_step = -1
        self._resumed_from: Path | None = None  # the Trainer folder this process resumed from
        self._model: Any = None
        self._optimizer: Any = None  # the torch optimizer (accelerate's wrapper holds it)
        self._wrapper: Any = None  # what the Trainer calls step() on
        self._scheduler: Any = None
        self._asked_max_steps = -1  # the script's max_steps (smoke mode shortens the Trainer's)
        self._planned_epochs: int | None = None
        self._rollback: Any = None  # the monitor's rollback action (its batches to skip)
        self._dropping: list[int] | None = None  # a rollback's skip: [first step, batches]
        self._tqdm_monitors: set[Any] = set()  # tqdm's monitor threads before train() began
        self._args: Any = None  # the Trainer's arguments, state and control, for live/
        self._trainer_state: Any = None
        self._control: Any = None
        self._trainer: Any = None  # the Trainer whose hook this is (found up the stack)
        self._trackers_follow = False  # report_to callbacks after this one: found later
        self._reporters_env: list[str] = []  # variables set to continue report_to's runs

    @property
    def config(self) -> dict[str, Any]:
        """The hyperparameters: ``config`` after ``prudent run --set`` or the tuner."""
        return self.adapter.config

    def resume_path(self) -> str | None:
        """The checkpoint folder for ``trainer.train(resume_from_checkpoint=...)`` (None: fresh).
        A ``live/`` folder written before it was a complete Trainer folder (no
        ``trainer_state.json``) does not resume: the Trainer would count from step 0 again."""
        path = self.adapter.resume_path
        if path is None or (Path(path).name == LIVE and not (Path(path) / TRAINER_STATE).is_file()):
            return None
        return path

    # set-up ---------------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        args.logging_nan_inf_filter = False  # the logged loss shows a NaN as well
        hparams = {k: getattr(args, k) for k in HPARAMS if hasattr(args, k)}
        hparams = {k: getattr(v, "value", v) for k, v in hparams.items()}  # enums as strings
        for key, value in self.adapter.merge_hparams(hparams).items():
            setattr(args, key, value)
        self._asked_max_steps = int(args.max_steps)
        if self.adapter.is_smoke:
            steps = self.adapter.smoke_steps or 8
            args.max_steps = 2 * steps
            if getattr(args, "eval_steps", None):
                args.eval_steps = steps
            # smoke runs are not the user's runs: their checkpoints stay in the throwaway home
            args.output_dir = str(self.adapter.ctx.run_dir / "trainer-output")
        self._output_dir = Path(args.output_dir)
        resumed = self.resume_path()
        self._resumed_from = Path(resumed) if resumed is not None else None
        self.adapter.framework_checkpoint.bind(self._newest_checkpoint)
        # before any report_to callback starts its tracker (in its on_train_begin)
        self._reporters_env = continue_trainer_reporters(_calling_trainer(sys._getframe(1)),
                                                         self.adapter.ctx)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        run_state = self.adapter.ctx.state
        run_state.step = state.global_step  # where the Trainer resumed
        self._args, self._trainer_state, self._control = args, state, control
        self._trainer = _calling_trainer(sys._getframe(1))
        self._use_trackers()  # those report_to callbacks that ran their on_train_begin before
        # ours; any that come after ours in the Trainer's list start their tracker after this
        self._trackers_follow = trackers_follow(self._trainer, self)
        if not self._trackers_follow:
            self._keep_reporters()
        self._tqdm_monitors = set(_tqdm_monitors())
        # the planned length the rules are sized to: the Trainer's own count of optimizer steps
        # (max_steps, or the epochs x ceil(batches / accumulation)); a smoke run's is its own
        # shortened one, so the plan is worked out from what the script asked for
        if self.adapter.is_smoke:
            run_state.num_steps, self._planned_epochs = _plan(
                args, self._asked_max_steps, train_dataloader)
        else:
            run_state.num_steps = state.max_steps if state.max_steps > 0 else None
            # (a loader without a length under max_steps: the Trainer plans sys.maxsize epochs)
            epochs = state.num_train_epochs
            self._planned_epochs = epochs if 0 < epochs < sys.maxsize else None
        # accelerate's AcceleratedOptimizer wraps the torch optimizer that steps; the scheduler
        # is watched too: reduce_lr scales its base learning rates, or its next step undoes it
        self._model, self._wrapper = model, optimizer
        self._optimizer = getattr(optimizer, "optimizer", optimizer)
        self._scheduler = _torch_scheduler(lr_scheduler)
        self.adapter.watch(model=model, optimizer=self._optimizer, scheduler=self._scheduler)
        self._rollback = self.adapter.rollback_skips()
        if model is not None and not self._hooks:
            self._hooks = [model.register_forward_pre_hook(self._forward_starts, with_kwargs=True),
                           model.register_forward_hook(self._forward_ends)]
        if model is not None and self._optimizer is not None:
            self.adapter.framework_checkpoint.bind(self._newest_checkpoint, self._files,
                                                   self._load_live)

    def _use_trackers(self) -> None:
        trainer = self._trainer
        self.adapter.use_trackers(lambda info: trainer_reporter_sinks(trainer, info))

    def _keep_reporters(self) -> None:
        """Every report_to callback has started its tracker: which runs, for a resume."""
        keep_trainer_reporters(self._trainer, self.adapter.ctx, self._reporters_env)
        self._reporters_env = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._trackers_follow:  # every callback's on_train_begin has run by now
            self._trackers_follow = False
            self._use_trackers()
            self._keep_reporters()

    def _newest_checkpoint(self, folder: Path) -> Path | None:
        """The newest checkpoint folder this process's Trainer wrote (or the one it resumed
        from), copied: prudent's checkpoint carries it (None: none yet)."""
        source = self._written or self._resumed_from
        if source is None or not source.is_dir():
            return None
        target = folder / source.name
        shutil.copytree(source, target)
        return target

    def _files(self) -> tuple[str, dict[str, Any]]:
        """What prudent's checkpoint carries, made in memory (no scratch folder written and
        read back): the Trainer's folder when it saved this very step (a stop), else a
        complete Trainer folder of this step (``live/``). A folder the Trainer wrote at an
        earlier step is not carried: ``live/`` is newer, and a rollback or ``restore_best``
        must get the weights of the checkpoint's step."""
        written = self._written
        if written is not None and self._written_step == self.adapter.ctx.state.step and (
                written.is_dir()):
            return written.name, folder_files(written, f"{written.name}/")
        files = _live_files(self._model, self._optimizer, self._scheduler)
        scaler = getattr(self._wrapper, "scaler", None)
        if scaler is not None:
            files[f"{LIVE}/{SCALER}"] = torch_bytes(scaler.state_dict())
        args = self._args
        rng_file = ("rng_state.pth" if args is None or args.world_size <= 1
                    else f"rng_state_{args.process_index}.pth")
        files[f"{LIVE}/{rng_file}"] = torch_bytes(_rng_states(args))
        if self._trainer_state is not None:
            files[f"{LIVE}/{TRAINER_STATE}"] = _trainer_state_json(
                self._trainer_state, self._trainer, self._control).encode()
        return LIVE, files

    def _load_live(self, path: Path) -> None:
        """A checkpoint restored while ``train()`` runs: the weights, the optimizer's and the
        LR scheduler's state as they were then, in place, between two steps (the Trainer's
        step counter, epoch and data position go on). Read without unpickling: safetensors,
        or ``torch.load(weights_only=True)`` as the Trainer reads its own files."""
        live = path.parent / LIVE
        folder = live if live.is_dir() else path
        _load_weights(self._model, folder)
        self._optimizer.load_state_dict(
            torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=True))
        if self._scheduler is not None and (folder / SCHEDULER).is_file():
            self._scheduler.load_state_dict(torch.load(folder / SCHEDULER, weights_only=True))

    # the loop -------------------------------------------------------------------------------
    def on_epoch_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        self._end_epoch(control)
        self.adapter.epoch_start(int(state.epoch or 0), self._planned_epochs,
                                 _steps_per_epoch(train_dataloader, args))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the Trainer evaluates after this hook: the epoch ends for prudent once it has
        self._epoch_done = round(state.epoch or 1) - 1

    def _end_epoch(self, control: Any) -> None:
        done, self._epoch_done = self._epoch_done, None
        if done is not None and self.adapter.epoch_end(done) is not None:
            control.should_training_stop = True

    def _forward_starts(self, module: Any, inputs: Any, kwargs: Any) -> None:
        if module.training and not self._in_step:
            self._in_step = True
            self.adapter.batch_loaded(kwargs or inputs)

    def _forward_ends(self, module: Any, inputs: Any, output: Any) -> None:
        if not module.training or (self._rollback is not None and self._rollback.skip_left):
            return  # (a batch a rollback skips: its loss is judged by no rule)
        loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
        if loss is not None:
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._drop_batch(state)  # a micro-batch of gradient accumulation was trained

    def _drop_batch(self, state: Any) -> bool:
        """The micro-batch just trained is one a rollback skips (``skip_batches``): its
        gradients go. The Trainer draws its own batches, so a skipped batch is drawn and its
        forward and backward run, but it changes nothing. True: it was one."""
        rollback = self._rollback
        if rollback is None or not rollback.take_skip():
            return False
        if self._dropping is None:
            self._dropping = [state.global_step + 1, 0]
        self._dropping[1] += 1
        if self._model is not None:
            self._model.zero_grad(set_to_none=True)
        return True

    def _dropped(self, last_step: int) -> None:
        """A rollback's skip is done (or the run ends in it): say what was not trained."""
        (first, batches), self._dropping = self._dropping, None
        self.adapter.batches_skipped(
            batches, first, last_step, "were drawn by the Trainer (it draws its own data) and "
            "not trained: their gradients dropped, no update made from them",
            self._rollback.skip_left if self._rollback is not None else 0)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        inner = self._optimizer
        before = vars(inner).get("step") if inner is not None else None
        if self._drop_batch(state):
            # every batch of this step is one a rollback skips (a skip starts at a step): no
            # update, made a no-op as the monitor skips an outlier's, and no loss to judge
            self._loss = None
            if inner is not None:
                replace_next_step(inner, "dropped")
        else:
            # the step's loss, judged before the update (loss_spike's skip), as run.backward()
            # announces it; the Trainer has no hook between forward and backward, so its
            # gradients exist already
            self.adapter.loss_ready(self._loss)
        if inner is not None and vars(inner).get("step") is not before and (
                self._wrapper is not inner):
            # a component made this step's update a no-op (loss_spike's skip): the Trainer
            # steps accelerate's wrapper, which with a GradScaler puts its own step() on the
            # torch optimizer first; this once, the wrapper calls the no-op directly
            # (the wrapper's own step, the LR scheduler's wrapper of it where there is one, is
            # back after that call)
            replace_next_step(self._wrapper, "once", then=lambda: inner.step())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loss, self._loss, self._in_step = self._loss, None, False
        inner = self._optimizer
        if inner is not None:
            put_back_step(inner, "dropped")  # a GradScaler's inf skipped the step: not left behind
        adapter = self.adapter
        adapter.count_step({"loss": loss} if loss is not None else {})
        if self._dropping is not None and not self._rollback.skip_left:
            self._dropped(state.global_step)
        pending = adapter.stop_pending()
        if pending is None:
            return
        control.should_training_stop = True
        # a pruned trial never resumes, NaN weights are not worth it, preflight's overfit
        # run is done: no checkpoint for those
        if pending.kind in (StopKind.PRUNED, StopKind.PREFLIGHT) or pending.rule == "non_finite":
            adapter.take_stop()
        else:  # the Trainer writes its checkpoint first; prudent's takes it along (on_save)
            control.should_save = True
            self._saving_to_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._written = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self._written_step = state.global_step
        if self._saving_to_stop:
            self._saving_to_stop = False
            self.adapter.take_stop()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    **kwargs: Any) -> None:
        if self.adapter.stop is None and metrics:
            # the model's metrics; the Trainer's timing of its evaluation (eval_runtime,
            # eval_*_per_second: the profiler times evaluation itself) and its epoch counter
            # are no metric of the model
            values = {k: v for k, v in metrics.items() if isinstance(v, (int, float))
                      and k != "epoch" and not k.endswith(("_runtime", "_per_second"))}
            if self.adapter.log(**values) is not None:
                control.should_training_stop = True

    # the end --------------------------------------------------------------------------------
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_epoch(control)
        if self._dropping is not None:
            self._dropped(state.global_step)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        _end_tqdm_monitors(self._tqdm_monitors)
        self.adapter.framework_checkpoint.bind(None)
        self._trainer = self._trainer_state = self._control = None  # (the Trainer holds us)
        self.adapter.finish()


def _steps_per_epoch(loader: Any, args: Any) -> int | None:
    """Optimizer steps per epoch as the Trainer counts them: a last, shorter accumulation of
    an epoch steps the optimizer too (None: the loader has no length)."""
    try:
        batches = len(loader)
    except TypeError:
        return None
    return max(1, math.ceil(batches / max(1, args.gradient_accumulation_steps)))


def _plan(args: Any, max_steps: int, loader: Any) -> tuple[int | None, int | None]:
    """The run's planned optimizer steps and epochs for ``max_steps`` (as the script set it,
    -1: none) and ``args.num_train_epochs``, as ``Trainer.set_initial_training_values``
    works them out (None: unknown, the loader has no length)."""
    per_epoch = _steps_per_epoch(loader, args)
    if max_steps > 0:
        return max_steps, math.ceil(max_steps / per_epoch) if per_epoch else None
    if per_epoch is None:
        return None, None
    return math.ceil(args.num_train_epochs * per_epoch), math.ceil(args.num_train_epochs)


def _tqdm_monitors() -> dict[Any, Any]:
    """tqdm's monitor threads now, each with the tqdm class that holds it."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return {}
    found, classes = {}, [std.tqdm]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        monitor = vars(cls).get("monitor")
        if monitor is not None:
            found[monitor] = cls
    return found


def _end_tqdm_monitors(before: set[Any]) -> None:
    """End the monitor threads tqdm started while ``train()`` ran, once no bar is open. The
    Trainer's checkpoints start one (``save_pretrained``'s "Writing model shards" bar, even
    with ``disable_tqdm``), and tqdm (4.70) ends it only with the process: a daemon thread
    left behind after training, waking every 10 s. tqdm starts a new one with its next bar."""
    for monitor, cls in _tqdm_monitors().items():
        if monitor in before:
            continue
        with cls.get_lock():
            if cls._instances or vars(cls).get("monitor") is not monitor:
                continue
            cls.monitor = None
        monitor.exit()


def _torch_scheduler(scheduler: Any) -> Any:
    """The torch LR scheduler (accelerate's AcceleratedScheduler wraps it when prepared)."""
    inner = getattr(scheduler, "scheduler", scheduler)
    return inner if isinstance(inner, torch.optim.lr_scheduler.LRScheduler) else None


def _calling_trainer(frame: Any) -> Any:
    """The ``Trainer`` whose loop calls this hook, found up the stack (the hook's arguments do
    not carry it; None where it is not found): ``trainer_state.json`` takes its callbacks'
    exportable states and its floating-point operations not yet added to the state."""
    from transformers import Trainer

    for _ in range(8):
        if frame is None:
            return None
        found = frame.f_locals.get("self")
        if isinstance(found, Trainer):
            return found
        frame = frame.f_back
    return None


def _trainer_state_json(state: Any, trainer: Any, control: Any) -> str:
    """``trainer_state.json`` as ``Trainer._save_checkpoint`` writes it, the live state left
    as it is: the exportable callbacks' states (and the control's) as they are now, and the
    floating-point operations counted since the last save (in a distributed run the Trainer
    sums them over the processes, a collective: the state's own total is kept there)."""
    from transformers.trainer_callback import ExportableState

    callbacks = [*(trainer.callback_handler.callbacks if trainer is not None else []), control]
    exported: dict[str, Any] = {}
    for callback in callbacks:
        if isinstance(callback, ExportableState):
            exported.setdefault(type(callback).__name__, []).append(callback.state())
    saved = dataclasses.asdict(state)
    saved["stateful_callbacks"] = {**(state.stateful_callbacks or {}), **{
        name: states if len(states) > 1 else states[0] for name, states in exported.items()}}
    if trainer is not None and trainer.args.world_size <= 1:
        saved["total_flos"] = state.total_flos + getattr(trainer, "current_flos", 0)
    return json.dumps(saved, indent=2, sort_keys=True) + "\n"


def _rng_states(args: Any) -> dict[str, Any]:
    """The random generators' states as ``Trainer._save_rng_state`` saves them (CPU, CUDA)."""
    import numpy as np

    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        distributed = args is not None and str(getattr(args.parallel_mode, "value",
                                                       args.parallel_mode)) == "distributed"
        states["cuda"] = (torch.cuda.random.get_rng_state_all() if distributed
                          else torch.cuda.random.get_rng_state())
    return states


def _live_files(model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """The model's, optimizer's and LR scheduler's state under the names of a Trainer
    checkpoint's files, each a DeferredFile: the checkpoint writer copies their tensors with
    the snapshot and serialises them on its thread while training goes on."""
    tensors: dict[str, Any] = {}
    seen: set[tuple[Any, ...]] = set()
    for name, tensor in model.state_dict().items():
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape)
        if tensor.numel() and where in seen:
            continue  # a tied weight: saved once, as the Trainer saves it
        seen.add(where)
        tensors[name] = tensor.detach().contiguous()
    files: dict[str, Any] = {f"{LIVE}/{WEIGHTS}": DeferredFile(tensors, _safetensors_bytes)}
    for name, obj in ((OPTIMIZER, optimizer), (SCHEDULER, scheduler)):
        if obj is not None:
            files[f"{LIVE}/{name}"] = DeferredFile(obj.state_dict())
    return files


def _safetensors_bytes(tensors: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    return save(tensors, metadata={"format": "pt"})


def _load_weights(model: Any, folder: Path) -> None:
    """The weights of a Trainer checkpoint folder (or of prudent's ``live/``) into ``model``:
    safetensors, one file or sharded, else ``pytorch_model.bin`` with ``weights_only=True``.
    Keys missing from the file must be weights tied to one it holds (saved once)."""
    from safetensors.torch import load_file

    files = _weight_files(folder)
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(file) if file.suffix == ".safetensors"
                     else torch.load(file, map_location="cpu", weights_only=True))
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {own[k].data_ptr() for k in state if k in own}
    untied = [k for k in missing if own[k].data_ptr() not in loaded]
    if unexpected or untied:
        raise RuntimeError(f"the checkpoint in {folder} does not fit the Trainer's model: "
                           f"missing {untied[:5]}, unexpected {unexpected[:5]}; was it written "
                           "for another model?")


def _weight_files(folder: Path) -> list[Path]:
    for single, index in ((WEIGHTS, WEIGHTS + ".index.json"),
                          (WEIGHTS_BIN, WEIGHTS_BIN + ".index.json")):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            shards = json.loads((folder / index).read_text())["weight_map"].values()
            return [folder / name for name in sorted(set(shards))]
    raise FileNotFoundError(f"no model weights ({WEIGHTS} or {WEIGHTS_BIN}) in {folder}: "
                            "cannot put the checkpoint back into the live model")
