"""The Run: the session the user's training loop talks to, with the user's verbs only.

It advances the counters and emits :class:`Event` s to components at fixed points of the
loop, through its :class:`~prudent.kernel.context.RunContext` (``run.context``), which is all that
components and framework adapters see. It knows nothing of checkpoints, rules or costs:
those are components, built by :func:`prudent.init`. See ``events.py`` for where each event
fires.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prudent.kernel.context import RunContext, describe
from prudent.kernel.errors import ConfigError, StopRun
from prudent.kernel.events import Event
from prudent.kernel.state import RunState
from prudent.kernel.stop import StopKind, StopReason, tell_launcher

T = TypeVar("T")

__all__ = ["Run", "RunSettings"]

SMOKE_MAX_EPOCHS = 2



class Batches(Iterator[Any]):
    """What ``run.batches(loader)`` returns: its batches, with the loader's ``len()`` where it
    has one (a generator has none, and progress loggers ask for it)."""

    __slots__ = ("_batches", "_loader")

    def __init__(self, batches: Iterator[Any], loader: Iterable[Any]) -> None:
        self._batches, self._loader = batches, loader

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]  # TypeError: a loader without one

    def close(self) -> None:
        """Stop early (as a generator's ``close``): the epoch's bookkeeping ends here."""
        self._batches.close()  # type: ignore[attr-defined]

class RunSettings(BaseModel):
    """``run:`` in prudent.yaml: how the kernel itself behaves."""

    model_config = ConfigDict(extra="forbid")

    device: str = Field("auto", description="run.device: auto picks cuda, then mps, then cpu.")
    handle_signals: bool = Field(True, description="Turn SIGTERM into a clean stop with reason "
                                 "'preempted' (only when the script has not set its own handler).")
    ranks_agree_every_s: float = Field(
        0.2, ge=0, description="Under torchrun: training time between two agreements of the "
        "ranks on a stop or a timed save (each costs a small all-reduce; a stop waits up to "
        "twice this); 0 agrees at every step (PRUDENT_RANKS_AGREE_EVERY_S).")

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise ValueError("allowed: auto, cpu, mps, cuda, cuda:N")
        return value


class Run:
    """One training run. Build it with :func:`prudent.init`, not directly."""

    def __init__(self, context: RunContext, settings: RunSettings | None = None, *,
                 smoke: bool = False) -> None:
        self.context = context
        self.settings = settings or RunSettings()
        self._smoke = smoke
        self._scaler: Any = None
        # gradient accumulation: backward calls in this step, the number per step last seen,
        # the micro-step losses summed, whether after_backward was announced this step
        self._micro = 0
        self._micro_per_step: int | None = None
        self._step_loss: Any = None
        self._announced = False
        self._positioned = False  # run.batches or run.steps put the loop where it was
        self._in_epochs = False  # inside run.epochs: a drawn epoch ends at its end
        self._loader: Iterable[Any] | None = None  # the last loader run.batches was given
        self._counter_read = False  # the loop read run.state (it continues its own count)
        self._warned_counter = False
        self._batch_loaded = context.handlers[Event.BATCH_LOADED]  # the hot path: looked up once

    # who and where ------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.context.id

    @property
    def name(self) -> str:
        return self.context.name

    @property
    def config(self) -> dict[str, Any]:
        """The hyperparameters: the ``init`` dict after ``prudent run --set`` or the tuner."""
        return self.context.config

    @property
    def state(self) -> RunState:
        """The counters (read-only for the loop): ``state.step`` is the number of completed
        ``run.step()`` calls (optimizer steps) over the whole run, restored when a run
        resumes; ``state.epoch`` the epoch in progress. A loop that keeps its own iteration
        counter starts it at ``run.state.step`` (or uses :meth:`steps`)."""
        self._counter_read = True
        return self.context.state

    @property
    def device(self) -> Any:
        """Where to put the model: the configured device, or the best one available."""
        if self.context.device is None:
            self.context.device = _resolve_device(self.settings.device, self._smoke)
        return self.context.device

    @property
    def is_smoke(self) -> bool:
        """True under ``prudent preflight``: train a few batches on the CPU, then stop."""
        return self._smoke

    @property
    def stop_reason(self) -> str | None:
        """How the run ended (``None``: completed or still running), e.g. ``rule:non_finite``."""
        reason = self.context.stop_reason
        return str(reason) if reason is not None else None

    @property
    def latest(self) -> dict[str, float]:
        """The newest value of each metric (step metrics lag by at most a flush)."""
        return self.context.latest

    @property
    def status(self) -> str:
        """``running``, then ``completed``, ``stopped`` or ``failed``."""
        return self.context.status

    @property
    def stopped_early(self) -> bool:
        """The run completed because a rule found the training done (early stopping): the
        model holds the best evaluation's weights; ``stop_reason`` names the rule."""
        ctx = self.context
        return ctx.status == "completed" and ctx.stop_reason is not None

    @property
    def exit_code(self) -> int:
        """What the process exits with, given how the run ended so far (see the README)."""
        return self.context.exit_code

    # the user's verbs ---------------------------------------------------------------------
    def attach(self, **objects: Any) -> Run:
        """Objects saved in checkpoints under their keyword (and restored now when resuming).
        A TensorBoard ``SummaryWriter`` is not saved: prudent's metrics, events and end go
        into it too, beside the script's own scalars."""
        import torch

        from prudent.tracking.tensorboard import is_summary_writer

        writers = [obj for obj in objects.values() if is_summary_writer(obj)]
        if writers:
            objects = {k: obj for k, obj in objects.items() if not is_summary_writer(obj)}
            self._take_writers(writers)
        for key, obj in objects.items():
            self.context.objects[key] = obj
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled():
                self._scaler = obj
        ctx = self.context
        try:
            ctx.emit(Event.ATTACH, dict(objects))
        except ConfigError as exc:  # what resuming found (shards that differ from their
            ctx.refuse(exc)  # manifest): exit 2 on every rank, nothing trained
        if ctx.resume_rng is not None:
            # a resumed run: the generators as they were at the checkpoint, for any loop shape
            # (run.batches and run.steps restore them again where their loop starts)
            from prudent.kernel.rng import restore_rng

            restore_rng(ctx.resume_rng)
        return self

    def _take_writers(self, writers: list[Any]) -> None:
        from prudent.tracking.component import TrackingComponent

        ctx = self.context
        for component in ctx.components:  # rank 0's (the other ranks write to no tracker)
            if isinstance(component, TrackingComponent):
                for writer in writers:
                    component.take_writer(ctx, writer)

    def carry(self, value: T, name: str = "batch") -> T:
        """A value the loop keeps across ``run.step()``, travelling in the checkpoint (each
        rank's own): nanoGPT's batch drawn after the forward pass for the next iteration, or
        a number it keeps from one iteration to the next (``best_val_loss``). Returns
        ``value``; resuming, the first call of each ``name`` before the loop starts returns
        the value the checkpoint carried instead (tensors on the devices of ``value``)::

            X, Y = run.carry(get_batch("train"))      # before the loop
            best = run.carry(1e9, "best_val_loss")
            for it in run.steps(max_iters):
                ...
                X, Y = run.carry(get_batch("train"))  # the prefetch, where it was
                if val < best:
                    best = run.carry(val, "best_val_loss")
        """
        ctx = self.context
        if name in ctx.resume_carried:
            saved = ctx.resume_carried.pop(name)
            if not self._positioned:
                value = _on_devices_of(value, saved)
        ctx.carried[name] = value
        return value

    def steps(self, num_steps: int) -> Iterator[int]:
        """Yield iteration numbers from the step the run was restored at up to ``num_steps - 1``:
        ``for it in run.steps(max_iters):`` for a loop without epochs (nanoGPT's). The body
        calls ``run.step()`` once per iteration (after its micro-steps, if it accumulates).

        Resuming, the generators are put back as they were at the checkpoint before the first
        iteration, so batches drawn with ``torch.randint`` continue exactly. In smoke mode
        (``prudent preflight``) the loop stops after a few steps; ``state.num_steps`` keeps the
        requested number for projections.
        """
        ctx, state = self.context, self.context.state
        state.num_steps = num_steps
        state.world_size = ctx.world_size  # no data position to carry to another world
        self._positioned = True
        rng, ctx.resume_rng = ctx.resume_rng, None
        if rng is not None:
            from prudent.kernel.rng import restore_rng

            restore_rng(rng)
        ctx.mark_boundary()  # after each step, run.step marks it
        while state.step < num_steps:
            if ctx.step_limit is not None and state.step >= ctx.step_limit:
                return
            ctx.check_stop()
            it = state.step
            yield it
            if state.step == it:
                raise RuntimeError(f"run.steps: iteration {it} ended without run.step(); call "
                                   "run.step() once per iteration (after its micro-steps)")

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Yield epoch indices, starting at the epoch in progress when the run was restored.

        In smoke mode (``prudent preflight``) at most two epochs run: enough for every
        per-epoch path; ``state.num_epochs`` keeps the requested number for projections.
        """
        state, ctx = self.context.state, self.context
        state.num_epochs = num_epochs
        if self._smoke:
            num_epochs = min(num_epochs, SMOKE_MAX_EPOCHS)
        while state.epoch < num_epochs:
            ctx.mark_boundary()  # an evaluation at the epoch's top is done again on resume
            self._in_epochs = True
            try:
                yield state.epoch
            finally:
                self._in_epochs, ctx.epoch_drawn = False, None
            if self._loader is not None:  # before EPOCH_END's checkpoint: see RunState
                from prudent.kernel.data import loader_generator_states

                state.loader_rng = loader_generator_states(self._loader)
            state.epoch += 1
            state.batches_in_epoch, state.epoch_samples_before = 0, 0
            ctx.emit(Event.EPOCH_END, state.epoch - 1)
            ctx.check_stop()

    def batches(self, loader: Iterable[Any]) -> Batches:
        """Yield the loader's batches, timing each wait for data. ``len()`` of it is the
        loader's (a progress logger around it, torchvision's ``MetricLogger.log_every`` or
        tqdm, needs one)."""
        return Batches(self._batches(loader), loader)

    def _batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        ctx, state = self.context, self.context.state
        try:
            state.batches_per_epoch = len(loader)  # type: ignore[arg-type]
        except TypeError:
            state.batches_per_epoch = None
        ctx.epoch_drawn = None
        iterator = self._position(loader)
        self._positioned, self._loader = True, loader
        for wrap in ctx.batch_wrappers:
            iterator = wrap(iterator)
        clock = time.perf_counter
        on_loaded = self._batch_loaded
        while True:
            ctx.check_stop()
            started = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                if self._in_epochs:  # the epoch's end runs next: see RunContext.epoch_drawn
                    from prudent.kernel.data import loader_generator_states

                    ctx.epoch_drawn = {"epoch": state.epoch + 1,
                                       "loader_rng": loader_generator_states(loader)}
                return
            loaded = clock()
            wait_s = loaded - started
            state.batches_in_epoch += 1
            times = ctx.loop_times
            if times is not None:
                times.batch_loaded(loaded, wait_s, batch)
            for handler in on_loaded:
                handler(ctx, batch, wait_s)
            yield batch

    def _position(self, loader: Iterable[Any]) -> Iterator[Any]:
        """A fresh epoch's iterator, or one that continues a restored epoch where it stopped."""
        from prudent.kernel.data import (
            epoch_start_state,
            restore_loader_generators,
            resume_iterator,
        )
        from prudent.kernel.rng import restore_rng

        state = self.context.state
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # DistributedSampler: never reset to epoch 0
            sampler.set_epoch(state.epoch)
        moved = state.world_size not in (None, self.context.world_size)
        if state.epoch_samples_before or (moved and state.batches_in_epoch):
            return self._continue_epoch(loader)
        state.world_size = self.context.world_size
        state.batch_size = getattr(loader, "batch_size", None)
        rng, self.context.resume_rng = self.context.resume_rng, None
        if rng is None or not state.batches_in_epoch or state.epoch_rng is None:
            if rng is not None:
                restore_rng(rng)
                if state.loader_rng and not state.batches_in_epoch:
                    # restored between epochs: the loader's own generators as the last epoch
                    # left them (the script's seeding made them new), so this epoch's order
                    # is the one the uninterrupted run drew
                    restore_loader_generators(loader, state.loader_rng)
            state.batches_in_epoch, state.loader_rng = 0, None
            state.epoch_rng = epoch_start_state(loader)
            return iter(loader)
        return resume_iterator(loader, state.epoch_rng, state.batches_in_epoch,
                               after_skip=lambda: restore_rng(rng))

    def _continue_epoch(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The rest of an epoch that another number of ranks began (or whose rest a resume
        dealt anew): from its position in global samples, dealt over this world's ranks
        (``prudent.kernel.data.continue_epoch_at``), exact only for a ``DistributedSampler``, whose
        ranks' batches are interleaved shares of one order."""
        import torch

        from prudent.kernel.data import continue_epoch_at, restore_loader_generators
        from prudent.kernel.rng import restore_rng

        ctx, state = self.context, self.context.state
        batch_size = state.batch_size or getattr(loader, "batch_size", None) or 1
        start = (state.epoch_samples_before
                 + state.batches_in_epoch * batch_size * (state.world_size or ctx.world_size))
        rng, ctx.resume_rng = ctx.resume_rng, None
        if state.epoch_rng is not None:  # what the epoch's iterator drew its seeds from
            torch.set_rng_state(state.epoch_rng["torch"])
            restore_loader_generators(loader, state.epoch_rng)
        continued = continue_epoch_at(loader, start,
                                      after_start=lambda: restore_rng(rng) if rng else None)
        if continued is None:
            ctx.refuse(ConfigError(
                f"the checkpoint was taken on {state.world_size} ranks {start} samples into "
                f"epoch {state.epoch + 1} and this run has {ctx.world_size}, but this "
                f"{type(loader).__name__} does not deal its data with a DistributedSampler: "
                "prudent cannot tell which samples the other ranks already trained. Resume on "
                "the same number of ranks, use a DataLoader with a DistributedSampler, or "
                "resume from a checkpoint taken at an epoch's end"))
        state.epoch_samples_before, state.batches_in_epoch = start, 0
        state.world_size, state.batch_size = ctx.world_size, getattr(loader, "batch_size", None)
        return iter(continued)  # type: ignore[arg-type]

    def backward(self, loss: Any, *, last: bool | None = None) -> None:
        """``loss.backward()`` (scaled when a GradScaler is attached), the loss hooks before it
        and the gradient hooks after.

        Several calls before one ``run.step()`` are micro-steps of one optimizer step
        (gradient accumulation): the hooks run once, around the last one, with the sum
        of the micro-step losses as passed. Which call is the last is learnt from the steps
        before (the first step of a run is measured on every micro-step); ``last=True`` or
        ``False`` says it outright.
        """
        micro = self._micro + 1
        step_loss = loss if micro == 1 else self._step_loss.detach() + loss.detach()
        if last is None:
            last = self._micro_per_step is None or micro >= self._micro_per_step
        if last:
            self.context.before_backward(step_loss)
        (self._scaler.scale(loss) if self._scaler is not None else loss).backward()
        self._micro, self._step_loss = micro, step_loss
        if last:
            self._announce_backward()

    def _announce_backward(self) -> None:
        self._announced = True
        self.context.after_backward(self._step_loss)

    def step(self, **metrics: Any) -> None:
        """End of one optimisation step: metrics (numbers or 0-d tensors), rules, stop checks."""
        ctx = self.context
        if self._micro:
            if not self._announced:  # fewer micro-steps than before: the hooks run now
                self._announce_backward()
            self._micro_per_step, self._micro, self._announced = self._micro, 0, False
            self._step_loss = None
        if not self._positioned and not self._warned_counter:
            self._warn_counter_restarts()
        ctx.end_step(metrics)
        if ctx.pending_stop is not None and not ctx.defer_stops:
            ctx.raise_stop()

    def _warn_counter_restarts(self) -> None:
        """A resumed loop that counts for itself from 0 trains the steps already done again."""
        self._warned_counter = True
        step = self.context.state.step
        if step and not self._counter_read:
            import warnings

            warnings.warn(f"prudent: run {self.id} resumed at step {step}, but the loop uses "
                          "neither run.steps(n) nor run.batches(loader) and never reads "
                          "run.state.step: if it counts its iterations from 0 it trains "
                          f"{step} steps more than asked. Write `for it in run.steps(max_iters):`"
                          " (or start the counter at run.state.step)", stacklevel=3)

    def log(self, **metrics: Any) -> None:
        """Evaluation metrics (converted to floats now: they are rare and the tuner reads them).

        A pending stop is made here, except in an epoch's end, where ``run.epochs`` makes it."""
        from prudent.store.writer import to_floats

        values = dict(zip(metrics, to_floats(metrics.values())))
        self.context.host_reads.clear()
        self.context.logged.update(values)
        self.context.emit(Event.LOG, values)
        if self.context.epoch_drawn is None:
            self.context.check_stop()
        # else in an epoch's end (its batches drawn, the epoch not yet counted): run.epochs
        # makes the stop once the whole epoch's end has run; made here, a scheduler the loop
        # steps after its evaluation was never stepped for the epoch the resume skips

    def capture(self, reason: str = "user", message: str = "",
                error: BaseException | None = None) -> None:
        """Ask for a failure bundle of this step (batch, state, RNG, stack; see prudent.debug).

        Safe from another thread: the bundle is then written at the loop's next step.
        """
        self.context.capture(reason, message, error)

    # the block ----------------------------------------------------------------------------
    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        ctx = self.context
        if exc is None:
            ctx.finish("completed")
            return False
        if isinstance(exc, KeyboardInterrupt):
            # a stop already requested (the stall watchdog interrupts the main thread) wins
            reason = ctx.pending_stop or StopReason(StopKind.INTERRUPTED, None,
                                                    "KeyboardInterrupt (Ctrl-C)")
            exc = StopRun(reason)
            if not ctx.exit_on_stop:
                ctx.finish("stopped", StopReason(StopKind.INTERRUPTED, None, exc.message),
                           exc.message)
                return False
        if isinstance(exc, StopRun) and exc.stop.kind is StopKind.PREEMPTED \
                and ctx.world_size > 1:
            self._peer_crash_is_not_a_preemption()  # torchrun's SIGTERM after a rank's crash
        if isinstance(exc, StopRun) and exc.stop.finished:
            ctx.finish("completed", exc.stop, exc.message)  # early stopping: the code after
            return True  # `with run:` runs (saving, testing, exporting the best weights), exit 0
        if isinstance(exc, StopRun):
            ctx.finish("stopped", exc.stop, exc.message)
            if ctx.exit_on_stop:
                tell_launcher(exc.exit_code, exc.message)
                raise SystemExit(exc.exit_code)
            return True
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            ctx.finish("completed")
            return False
        if ctx.closed:  # the run already ended (refused: bad input found mid-way)
            return False
        if ctx.world_size > 1 and isinstance(exc, Exception):
            from prudent.distributed.elastic import announce_crash, peer_lost
            from prudent.distributed.torchrun import ranks_from_env

            lost = peer_lost(exc)
            if lost is not None:  # not the script's failure: the survivors resume elsewhere
                self._peer_crash_is_not_a_preemption()
                self._rank_lost(lost)
            announce_crash(ranks_from_env().rank, describe(exc))
        ctx.fail(exc)  # a bundle before END: the state is as it failed
        return False

    def _peer_crash_is_not_a_preemption(self) -> None:
        """Another rank's script raised (its note in torch.distributed's store says so): this
        rank's failed collective, or torchrun's SIGTERM that followed, is that crash, not a
        machine gone. The run fails (exit 1: a bug is not resumed without end as a 75 is)."""
        from prudent.distributed.elastic import crashed_peer
        from prudent.distributed.torchrun import ranks_from_env
        from prudent.kernel.stop import ExitCode

        ctx = self.context
        ranks = ranks_from_env()
        crashed = crashed_peer(ctx.world_size, ranks.rank)
        if crashed is None:
            return
        message = f"{crashed} (its capture bundle and traceback are in that rank's output)"
        if ranks.is_main:
            print(f"prudent | {ctx.id} | failed: {message}", file=sys.stderr, flush=True)
        ctx.finish("failed", StopReason(StopKind.ERROR, None, message), message)
        if ctx.exit_on_stop:
            tell_launcher(int(ExitCode.ERROR), message)
            raise SystemExit(int(ExitCode.ERROR))

    def _rank_lost(self, error: str) -> None:
        """Another rank's process or machine is gone (its collectives failed): a stop to
        resume from the newest checkpoint, exit 75 for torchrun to restart this worker in the
        world that is left (no stop save: the step that failed was half done)."""
        from prudent.kernel.events import EventKind
        from prudent.kernel.stop import ExitCode

        ctx = self.context
        message = (f"a rank of the job was lost at step {ctx.state.step + 1} ({error}): "
                   "resume from the newest checkpoint with the ranks that are left")
        ctx.record_event(EventKind.LIFECYCLE, "rank_lost", message, error=error)
        ctx.finish("stopped", StopReason(StopKind.PREEMPTED, None, message), message)
        if ctx.exit_on_stop:
            tell_launcher(int(ExitCode.PREEMPTED), message)
            raise SystemExit(int(ExitCode.PREEMPTED))


def _on_devices_of(like: Any, saved: Any) -> Any:
    """``saved`` (loaded on the CPU) with each tensor on the device of the tensor at the same
    place in ``like``, the value the script just built."""
    import torch

    if isinstance(saved, torch.Tensor):
        return saved.to(like.device) if isinstance(like, torch.Tensor) else saved
    if isinstance(saved, (tuple, list)) and isinstance(like, (tuple, list)) \
            and len(saved) == len(like):
        return type(saved)(_on_devices_of(a, b) for a, b in zip(like, saved))
    if isinstance(saved, dict) and isinstance(like, dict):
        return {k: _on_devices_of(like.get(k), v) for k, v in saved.items()}
    return saved


def _resolve_device(setting: str, smoke: bool) -> Any:
    import torch

    if setting == "cpu" or (smoke and setting == "auto"):  # smoke: CPU unless told otherwise
        return torch.device("cpu")
    if setting != "auto":
        return torch.device(setting)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
