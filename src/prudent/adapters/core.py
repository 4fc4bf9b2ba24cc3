"""AdapterRun: a prudent run driven from a framework's hooks instead of the user's loop.

The framework owns the loop (``Trainer.fit``, ``Trainer.train()``, ``model.fit``); its
callback calls these verbs at the same points where a hand-written loop calls ``run.batches``,
``run.backward``, ``run.step`` and ``run.log``, so the same components (rules, meter,
profiler, preemption watcher, checkpointer, store) see the same events. What differs is the
stop: a framework cannot be unwound by an exception from inside a hook, so :meth:`take_stop`
announces the stop (the checkpointer saves at once) and returns the reason; the callback then
sets the framework's own stop flag, and :meth:`finish` ends the process with prudent's exit
code once the framework has returned from its loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from prudent.adapters.files import FrameworkCheckpoint
from prudent.kernel.errors import StopRun
from prudent.kernel.events import Event, EventKind
from prudent.kernel.stop import StopKind, StopReason
from prudent.wiring.hparams import untracked

__all__ = ["AdapterRun"]

clock = time.perf_counter


class AdapterRun:
    """The framework-neutral half of an adapter callback: one run, started by ``prudent.init``.

    ``framework`` names the folder the framework's checkpoint files are restored to; the
    other arguments are :func:`prudent.init`'s. Build it when the callback is built: then
    ``config`` (after ``--set`` / the tuner) is known before the model is, SIGTERM is handled
    from the start, and a resumed run's checkpoint is on disk before the framework asks.
    """

    def __init__(self, framework: str, name: str | None = None,
                 config: Mapping[str, Any] | None = None, *, exit_on_stop: bool = True,
                 **init_kwargs: Any) -> None:
        import prudent

        self.run = prudent.init(name=name, config=config, exit_on_stop=exit_on_stop,
                                **init_kwargs)
        self.ctx = self.run.context
        self.framework_checkpoint = FrameworkCheckpoint(self.ctx.run_dir / framework)
        self.run.attach(**{framework: self.framework_checkpoint})
        self.stop: StopReason | None = None  # the stop taken, once the framework was told
        self._batch_end: float | None = None
        self._watched: set[int] = set()
        self._batch_loaded = self.ctx.handlers[Event.BATCH_LOADED]

    # what the callback reads ----------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        return self.ctx.config

    @property
    def is_smoke(self) -> bool:
        """Under ``prudent preflight``: shorten the run through the framework's own limits."""
        return self.run.is_smoke

    @property
    def preflight_mode(self) -> str | None:
        """``smoke`` (a few batches per epoch, two epochs) or ``overfit`` (one batch again and
        again) under ``prudent preflight``; None otherwise."""
        if not self.is_smoke:
            return None
        from prudent.launch.spec import LaunchSpec

        asked = LaunchSpec.from_env().preflight
        return (asked.mode if asked is not None else None) or "smoke"

    @property
    def overfit_steps(self) -> int:
        """At most this many steps in overfit mode (the probe stops the run sooner)."""
        from prudent.launch.spec import LaunchSpec

        asked = LaunchSpec.from_env().preflight
        return max(2, asked.overfit_steps or 300) if asked is not None else 300

    @property
    def smoke_steps(self) -> int | None:
        """Optimizer steps per epoch in a smoke run (None outside one); two epochs run."""
        limit = self.ctx.step_limit
        return max(1, limit // 2) if self.is_smoke and limit else None

    @property
    def resume_path(self) -> str | None:
        """The framework's checkpoint to resume from (None: a fresh run)."""
        restored = self.framework_checkpoint.restored
        return str(restored) if restored is not None else None

    @property
    def closed(self) -> bool:
        return self.ctx.closed

    # hyperparameters ------------------------------------------------------------------------
    def merge_hparams(self, hparams: Mapping[str, Any]) -> dict[str, Any]:
        """Put the framework's hyperparameters and ``run.config`` together.

        A key ``run.config`` has wins (that is where ``--set`` and the tuner write): the
        values returned are the ones the framework must take over. Keys only the framework
        has are added to ``run.config`` and its record, so ``prudent show`` lists them.
        """
        config = self.ctx.config
        changed = {k: config[k] for k, v in hparams.items() if k in config and config[k] != v}
        added = {k: v for k, v in hparams.items() if k not in config and _plain(v)}
        if added:
            config.update(added)
            if self.ctx.store is not None:  # from the writer's thread: a locked store waits
                store, run_id, values = self.ctx.store, self.ctx.id, untracked(config)
                self.ctx.writer.call_soon(lambda: store.update_run(run_id, config=values))
        return changed

    def use_trackers(self, find: Callable[[Any], list[Any]]) -> None:
        """The framework's own loggers get prudent's metrics, events and end instead of a
        tracker run of prudent's own: ``find(info)`` builds their sinks
        (:mod:`prudent.tracking`), on the rank that writes to trackers only."""
        from prudent.tracking.component import TrackingComponent

        for component in self.ctx.components:  # rank 0's (the other ranks have none)
            if isinstance(component, TrackingComponent):
                component.adopt(self.ctx, find)

    def watch(self, **objects: Any) -> None:
        """Show the framework's model and optimizers to the components (gradient statistics,
        learning rates, the preflight probe); the framework's own checkpoint saves them."""
        new = {k: v for k, v in objects.items() if v is not None and id(v) not in self._watched}
        self._watched.update(id(v) for v in new.values())
        if new:
            self.ctx.emit(Event.ATTACH, new)

    def rollback_skips(self) -> Any:
        """The monitor's rollback action, told that this loop skips batches, as
        ``run.batches`` tells it (its event then says so): after a rollback its ``skip_left``
        counts the batches the callback must keep from training, each one taken off as it
        passes. None: no monitor."""
        for component in self.ctx.components:
            actions = getattr(component, "actions", None)
            rollback = actions.get("rollback") if isinstance(actions, dict) else None
            if rollback is not None and hasattr(rollback, "skip_left"):
                rollback.skips_batches = True
                return rollback
        return None

    def batches_skipped(self, batches: int, first_step: int, last_step: int, how: str,
                        left: int = 0) -> None:
        """Say which batches after a rollback were not trained, and how (``how``)."""
        steps = (f"step {first_step}" if first_step == last_step
                 else f"steps {first_step}-{last_step}")
        self.ctx.record_event(
            EventKind.MONITOR, "skipped_update",
            f"{steps}: the {batches} batches after the rollback {how}"
            + (f"; {left} more to skip when the run resumes" if left else ""),
            step=last_step, reason="rollback", rule="loss_spike", batches=batches,
            first_step=first_step, last_step=last_step, left=left)

    def restore_rng(self) -> None:
        """A resumed run: the generators as they were at the checkpoint (once the framework
        restored its own state and before the first batch is drawn)."""
        rng, self.ctx.resume_rng = self.ctx.resume_rng, None
        if rng is not None:
            from prudent.kernel.rng import restore_rng

            restore_rng(rng)

    # the loop, as the framework runs it -----------------------------------------------------
    def epoch_start(self, epoch: int, num_epochs: int | None = None,
                    batches_per_epoch: int | None = None) -> None:
        state = self.ctx.state
        if epoch != state.epoch:
            state.epoch, state.batches_in_epoch = epoch, 0
        state.num_epochs = num_epochs
        state.batches_per_epoch = batches_per_epoch
        self._batch_end = clock()

    def batch_loaded(self, batch: Any) -> None:
        """A batch arrived: the time since the last one ended was spent waiting for data."""
        now = clock()
        wait_s = now - self._batch_end if self._batch_end is not None else 0.0
        ctx = self.ctx
        ctx.state.batches_in_epoch += 1
        times = ctx.loop_times
        if times is not None:
            times.batch_loaded(now, wait_s, batch)
        for handler in self._batch_loaded:
            handler(ctx, batch, wait_s)

    def after_backward(self, loss: Any) -> None:
        """Gradients exist, the optimizer has not stepped: gradient rules and capture."""
        self.ctx.after_backward(loss)

    def loss_ready(self, loss: Any) -> None:
        """The step's loss, its gradients computed, its update not made: the kernel's loss
        watch, as ``run.backward`` announces it (a NaN flagged, an outlier's update skipped;
        the frameworks have no hook between forward and backward that sees each optimizer
        step's whole loss), then :meth:`after_backward`. With the watch the monitor sleeps
        through the steps that need no look instead of reading every loss itself."""
        if loss is not None:
            self.ctx.before_backward(loss)
        self.ctx.after_backward(loss)

    def step_end(self, **metrics: Any) -> StopReason | None:
        """One optimizer step done: metrics, rules, checkpoint when due, budget, preemption.
        Returns the stop the framework must make now, if any (see :meth:`take_stop`)."""
        return self.step_done(metrics)

    def step_done(self, metrics: dict[str, Any]) -> StopReason | None:
        """:meth:`step_end` for a callback's per-step hook: the metrics as a dict (no keyword
        packing), the step counted and the stop checked in one call."""
        self.count_step(metrics)
        if self.stop is None and self.ctx.pending_stop is None:
            return None
        return self.take_stop()

    def count_step(self, metrics: dict[str, Any]) -> None:
        """:meth:`step_end` without announcing a stop: for a framework that must first write
        its own checkpoint (then :meth:`take_stop`; see :meth:`stop_pending`)."""
        self.ctx.end_step(metrics)
        self._batch_end = clock()

    def stop_pending(self) -> StopReason | None:
        """A stop requested but not yet announced (None: none, or ranks must agree first)."""
        if self.stop is not None or self.ctx.defer_stops:
            return None
        return self.ctx.pending_stop

    def batch_end(self) -> None:
        """A micro-batch of gradient accumulation ended without an optimizer step."""
        self._batch_end = clock()

    def log(self, take_stop: bool = True, **metrics: Any) -> StopReason | None:
        """Evaluation metrics (the tuner reads its objective here); returns a stop, if any
        (``take_stop=False``: a pending one is left for a later hook, the epoch's end)."""
        from prudent.store.writer import to_floats

        values = {k: v for k, v in zip(metrics, to_floats(metrics.values())) if v is not None}
        if values:
            self.ctx.host_reads.clear()
            self.ctx.logged.update(values)
            self.ctx.emit(Event.LOG, values)
        return self.take_stop() if take_stop else self.stop

    def epoch_end(self, epoch: int) -> StopReason | None:
        """The framework finished an epoch (not one cut short by a stop)."""
        if self.stop is not None:
            return self.stop
        state = self.ctx.state
        state.epoch, state.batches_in_epoch = epoch + 1, 0
        self.ctx.emit(Event.EPOCH_END, epoch)
        return self.take_stop()

    # stopping and the end -------------------------------------------------------------------
    def take_stop(self) -> StopReason | None:
        """The pending stop, announced once: recorded, and the components told (the
        checkpointer saves the framework's state now, unless the weights are worthless)."""
        if self.stop is not None:
            return self.stop
        ctx = self.ctx
        if ctx.pending_stop is None or ctx.defer_stops:
            return None
        try:
            ctx.raise_stop()
        except StopRun as stop:
            self.stop = stop.stop
        return self.stop

    def finish(self) -> None:
        """The framework's loop returned: close the run; a stopped run ends the process with
        prudent's exit code (``exit_on_stop=False``: it returns, ``run.stop_reason`` tells)."""
        if self.ctx.closed:
            return
        stop = self.take_stop()
        if stop is None or stop.finished:  # early stopping: the training is done, exit 0
            self.ctx.finish("completed", stop, stop.message if stop else "")
            return
        self.ctx.finish("stopped", stop, stop.message)
        if self.ctx.exit_on_stop:
            raise SystemExit(stop.exit_code)

    def interrupted(self) -> StopReason:
        """Ctrl-C (or the stall watchdog's interrupt of the main thread) broke the framework's
        loop off: the run ends stopped, as ``with run:`` ends it (a stop taken or requested
        before wins: the watchdog's ``rule:stalled``). Returns the reason; its exit code is
        the process's."""
        reason = self.stop or self.ctx.pending_stop or StopReason(
            StopKind.INTERRUPTED, None, "KeyboardInterrupt (Ctrl-C)")
        if not self.ctx.closed:
            self.ctx.finish("stopped", reason, reason.message)
        return reason

    def fail(self, exc: BaseException) -> None:
        """The framework's loop raised: a failure bundle and the record (the error goes on)."""
        if not self.ctx.closed:
            self.ctx.fail(exc)

    @property
    def exit_code(self) -> int:
        return self.ctx.exit_code


def _plain(value: Any) -> bool:
    """A value the record can hold and ``--set`` can override (no modules, no tensors)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
