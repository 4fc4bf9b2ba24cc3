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
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from prudent.adapters.core import AdapterRun
from prudent.stop import StopKind

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

    @property
    def config(self) -> dict[str, Any]:
        """The hyperparameters: ``config`` after ``prudent run --set`` or the tuner."""
        return self.adapter.config

    def resume_path(self) -> str | None:
        """The checkpoint folder for ``trainer.train(resume_from_checkpoint=...)`` (None: fresh)."""
        return self.adapter.resume_path

    # set-up ---------------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        args.logging_nan_inf_filter = False  # the logged loss shows a NaN as well
        hparams = {k: getattr(args, k) for k in HPARAMS if hasattr(args, k)}
        hparams = {k: getattr(v, "value", v) for k, v in hparams.items()}  # enums as strings
        for key, value in self.adapter.merge_hparams(hparams).items():
            setattr(args, key, value)
        if self.adapter.is_smoke:
            steps = self.adapter.smoke_steps or 8
            args.max_steps = 2 * steps
            if getattr(args, "eval_steps", None):
                args.eval_steps = steps
            # smoke runs are not the user's runs: their checkpoints stay in the throwaway home
            args.output_dir = str(self.adapter.ctx.run_dir / "trainer-output")
        self._output_dir = Path(args.output_dir)
        self.adapter.framework_checkpoint.bind(self._newest_checkpoint)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> None:
        self.adapter.ctx.state.step = state.global_step  # where the Trainer resumed
        # accelerate's AcceleratedOptimizer wraps the torch optimizer that steps
        self.adapter.watch(model=model, optimizer=getattr(optimizer, "optimizer", optimizer))
        if model is not None and not self._hooks:
            self._hooks = [model.register_forward_pre_hook(self._forward_starts, with_kwargs=True),
                           model.register_forward_hook(self._forward_ends)]

    def _newest_checkpoint(self, folder: Path) -> Path | None:
        """The newest checkpoint folder this process's Trainer wrote, copied: prudent's
        checkpoint carries it (None: none yet; the one resumed from stays carried)."""
        if self._written is None or not self._written.is_dir():
            return None
        target = folder / self._written.name
        shutil.copytree(self._written, target)
        return target

    # the loop -------------------------------------------------------------------------------
    def on_epoch_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        self._end_epoch(control)
        try:
            steps: int | None = len(train_dataloader) // max(1, args.gradient_accumulation_steps)
        except TypeError:
            steps = None
        self.adapter.epoch_start(int(state.epoch or 0), int(args.num_train_epochs), steps)

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
        if not module.training:
            return
        loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
        if loss is not None:
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.adapter.after_backward(self._loss)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loss, self._loss, self._in_step = self._loss, None, False
        adapter = self.adapter
        adapter.count_step({"loss": loss} if loss is not None else {})
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
        if self._saving_to_stop:
            self._saving_to_stop = False
            self.adapter.take_stop()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    **kwargs: Any) -> None:
        if self.adapter.stop is None and metrics:
            values = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            if self.adapter.log(**values) is not None:
                control.should_training_stop = True

    # the end --------------------------------------------------------------------------------
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_epoch(control)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.adapter.framework_checkpoint.bind(None)
        self.adapter.finish()
