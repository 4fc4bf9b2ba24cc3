"""The Run: the session the user's training loop talks to, with the user's verbs only.

It advances the counters and emits :class:`Event` s to components at fixed points of the
loop, through its :class:`~prudent.context.RunContext` (``run.context``), which is all that
components and framework adapters see. It knows nothing of checkpoints, rules or costs:
those are components, built by :func:`prudent.init`. See ``events.py`` for where each event
fires.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prudent.context import RunContext
from prudent.errors import StopRun
from prudent.events import Event
from prudent.state import RunState
from prudent.stop import StopKind, StopReason

__all__ = ["Run", "RunSettings"]

SMOKE_MAX_EPOCHS = 2


class RunSettings(BaseModel):
    """``run:`` in prudent.yaml: how the kernel itself behaves."""

    model_config = ConfigDict(extra="forbid")

    device: str = Field("auto", description="run.device: auto picks cuda, then mps, then cpu.")
    handle_signals: bool = Field(True, description="Turn SIGTERM into a clean stop with reason "
                                 "'preempted' (only when the script has not set its own handler).")

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
        handlers = context.handlers
        # the hot path: looked up once
        self._step_end = handlers[Event.STEP_END]
        self._after_backward = handlers[Event.AFTER_BACKWARD]
        self._batch_loaded = handlers[Event.BATCH_LOADED]

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
        ``run.step()`` calls over the whole run, restored when a run resumes."""
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
    def status(self) -> str:
        """``running``, then ``completed``, ``stopped`` or ``failed``."""
        return self.context.status

    @property
    def exit_code(self) -> int:
        """What the process exits with, given how the run ended so far (see the README)."""
        return self.context.exit_code

    # the user's verbs ---------------------------------------------------------------------
    def attach(self, **objects: Any) -> Run:
        """Objects saved in checkpoints under their keyword (and restored now when resuming)."""
        import torch

        for key, obj in objects.items():
            self.context.objects[key] = obj
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled():
                self._scaler = obj
        self.context.emit(Event.ATTACH, dict(objects))
        return self

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
            yield state.epoch
            state.epoch += 1
            state.batches_in_epoch = 0
            ctx.emit(Event.EPOCH_END, state.epoch - 1)
            ctx.check_stop()

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yield the loader's batches, timing each wait for data."""
        import time

        ctx, state = self.context, self.context.state
        try:
            state.batches_per_epoch = len(loader)  # type: ignore[arg-type]
        except TypeError:
            state.batches_per_epoch = None
        iterator = self._position(loader)
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
                return
            wait_s = clock() - started
            state.batches_in_epoch += 1
            for handler in on_loaded:
                handler(ctx, batch, wait_s)
            yield batch

    def _position(self, loader: Iterable[Any]) -> Iterator[Any]:
        """A fresh epoch's iterator, or one that continues a restored epoch where it stopped."""
        from prudent.data import epoch_start_state, resume_iterator
        from prudent.rng import restore_rng

        state = self.context.state
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # DistributedSampler: never reset to epoch 0
            sampler.set_epoch(state.epoch)
        rng, self.context.resume_rng = self.context.resume_rng, None
        if rng is None or not state.batches_in_epoch or state.epoch_rng is None:
            if rng is not None:
                restore_rng(rng)
            state.batches_in_epoch = 0
            state.epoch_rng = epoch_start_state(loader)
            return iter(loader)
        return resume_iterator(loader, state.epoch_rng, state.batches_in_epoch,
                               after_skip=lambda: restore_rng(rng))

    def backward(self, loss: Any) -> None:
        """``loss.backward()`` (scaled when a GradScaler is attached), then gradient hooks."""
        (self._scaler.scale(loss) if self._scaler is not None else loss).backward()
        ctx = self.context
        for handler in self._after_backward:
            handler(ctx, loss)

    def step(self, **metrics: Any) -> None:
        """End of one optimisation step: metrics (numbers or 0-d tensors), rules, stop checks."""
        ctx = self.context
        ctx.state.step += 1
        for handler in self._step_end:
            handler(ctx, metrics)
        if ctx.host_reads:
            ctx.host_reads.clear()  # the step's tensors are not kept past it
        if ctx.pending_stop is not None and not ctx.defer_stops:
            ctx.raise_stop()

    def log(self, **metrics: Any) -> None:
        """Evaluation metrics (converted to floats now: they are rare and the tuner reads them)."""
        from prudent.store import to_floats

        values = dict(zip(metrics, to_floats(metrics.values())))
        self.context.host_reads.clear()
        self.context.logged.update(values)
        self.context.emit(Event.LOG, values)
        self.context.check_stop()

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
        if isinstance(exc, StopRun):
            ctx.finish("stopped", exc.stop, exc.message)
            if ctx.exit_on_stop:
                raise SystemExit(exc.exit_code)
            return True
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            ctx.finish("completed")
            return False
        ctx.fail(exc)  # a bundle before END: the state is as it failed
        return False


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
