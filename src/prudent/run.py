"""The Run: the session the user's training loop talks to.

It owns the counters (:class:`RunState`), the clock and the stop request, and emits
:class:`Event` s to components at fixed points of the loop. It knows nothing of checkpoints,
rules or costs: those are components. See ``events.py`` for where each event fires.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import time
import traceback
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

from prudent.config import ProjectSettings
from prudent.errors import ExitCode, StopRun, exit_code_for
from prudent.events import Component, Event
from prudent.signals import SignalStopper
from prudent.state import RunState
from prudent.store import NullWriter, Store, StoreWriter, to_floats

__all__ = ["Run"]

ENV_RUN_ID = "PRUDENT_RUN_ID"
ENV_SUPERVISED = "PRUDENT_SUPERVISED"
ENV_SMOKE = "PRUDENT_SMOKE"
SMOKE_MAX_EPOCHS = 2


_HOST_READS = 4  # tensors whose host value Run.host_scalar remembers


class Run:
    """One training run. Build it with :func:`prudent.init`, not directly."""

    def __init__(self, *, run_id: str, name: str, config: dict[str, Any],
                 settings: ProjectSettings, store: Store | None, exit_on_stop: bool = True,
                 components: Iterable[Component] | None = None) -> None:
        self.id = run_id
        self.name = name
        self.config = config
        self.settings = settings
        self.store = store  # None on torchrun ranks other than 0: they write nothing
        self.writer: StoreWriter | NullWriter = (
            StoreWriter(store, settings.store.flush_interval_s) if store is not None else NullWriter())
        self.exit_on_stop = exit_on_stop
        self.state = RunState()
        self.objects: dict[str, Any] = {}
        self.started_at = time.time()
        self.stop_reason: str | None = None
        self.stop_deadline: float | None = None  # time.time() by which a stop must be done, if known
        self.status = "running"
        self._stop: tuple[str, str] | None = None
        self.defer_stops = False  # True while ranks must first agree (see distributed.py)
        self._stop_announced = False
        self._closed = False
        self._device: Any = None
        self._scaler: Any = None
        self._logged: dict[str, float] = {}
        self.gauges: dict[str, float] = {}  # live values a component publishes (cost_usd)
        # the last tensors read (weakly: a loss must not keep its graph alive) and their numbers
        self._host_reads: list[tuple[weakref.ref[Any], Any]] = []
        self._resume_rng: dict[str, Any] | None = None  # applied once the data is repositioned
        self._batch_wrappers: list[Callable[[Iterator[Any]], Iterator[Any]]] = []
        self._components: list[Component] = []
        self._handlers: dict[Event, list[Callable[..., None]]] = {event: [] for event in Event}
        self._step_end = self._handlers[Event.STEP_END]  # the hot path, looked up once
        if components is None:
            from prudent.components import default_components  # imports torch: not for the CLI

            components = default_components(settings)
        for component in components:
            self.add_component(component)
        self._signals = SignalStopper(self.request_stop)

    # wiring -------------------------------------------------------------------------------
    def add_component(self, component: Component) -> None:
        """Plug a component in; only the events it overrides will call it."""
        self._components.append(component)
        for event in Event:
            if component.overrides(event):
                self._handlers[event].append(getattr(component, event.method_name))

    @property
    def components(self) -> tuple[Component, ...]:
        return tuple(self._components)

    def emit(self, event: Event, *args: Any) -> None:
        """Deliver an event to every component handling it (components announce through this)."""
        for handler in self._handlers[event]:
            handler(self, *args)

    def wrap_batches(self, wrapper: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
        """Change what ``run.batches`` yields, for every epoch from now on.

        For components that must steer the loop without editing the script: preflight's short
        epochs, replay's captured batch. ``wrapper`` gets the epoch's (already repositioned)
        iterator and returns the one the loop sees; wrappers apply in the order they were added.
        """
        self._batch_wrappers.append(wrapper)

    def _start(self) -> None:
        if self.settings.run.handle_signals:
            self._signals.install()
        atexit.register(self._finish_at_exit)
        _watch_uncaught_exceptions()
        self.record_event("lifecycle", "start", f"run {self.id} started on {socket.gethostname()}",
                          pid=os.getpid())
        self.emit(Event.START)

    # the user's API -----------------------------------------------------------------------
    def attach(self, **objects: Any) -> Run:
        """Objects saved in checkpoints under their keyword (and restored now when resuming)."""
        import torch

        for key, obj in objects.items():
            self.objects[key] = obj
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled():
                self._scaler = obj
        self.emit(Event.ATTACH, dict(objects))
        return self

    @property
    def device(self) -> Any:
        """Where to put the model: the configured device, or the best one available."""
        if self._device is None:
            self._device = _resolve_device(self.settings.run.device, self.is_smoke)
        return self._device

    @property
    def is_smoke(self) -> bool:
        """True under ``prudent preflight``: train a few batches on the CPU, then stop."""
        return os.environ.get(ENV_SMOKE, "") not in ("", "0")

    @property
    def run_dir(self) -> Path:
        """``$PRUDENT_HOME/runs/<id>``: this run's files (checkpoints, traces, reports)."""
        path = Path(self.settings.store.home).resolve() / "runs" / self.id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def state_dict(self) -> dict[str, Any]:
        """Counters, RNG states and every component's state: all a checkpoint needs of the run."""
        from prudent.rng import capture_rng

        return {"state": self.state.state_dict(), "rng": capture_rng(),
                "components": {c.name: c.state_dict() for c in self._components}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the run back where ``state_dict`` was taken.

        The RNG is restored when training resumes (the next ``run.batches``), not now: the
        script's own setup (building the model) draws random numbers after ``init``. Mid-epoch,
        it is restored only after the epoch's shuffle order was redrawn and the batches already
        done were skipped.
        """
        self.state.load_state_dict(state.get("state", {}))
        saved = state.get("components", {})
        for component in self._components:
            if component.name in saved:
                component.load_state_dict(saved[component.name])
        self._resume_rng = state.get("rng")

    @property
    def latest(self) -> dict[str, float]:
        """The newest float value of each metric (step metrics lag by at most a flush)."""
        return {**self.writer.latest, **self._logged}

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Yield epoch indices, starting at the epoch in progress when the run was restored.

        In smoke mode (``prudent preflight``) at most two epochs run: enough for every
        per-epoch path; ``state.num_epochs`` keeps the requested number for projections.
        """
        self.state.num_epochs = num_epochs
        if self.is_smoke:
            num_epochs = min(num_epochs, SMOKE_MAX_EPOCHS)
        while self.state.epoch < num_epochs:
            yield self.state.epoch
            self.state.epoch += 1
            self.state.batches_in_epoch = 0
            self.emit(Event.EPOCH_END, self.state.epoch - 1)
            self._check_stop()

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yield the loader's batches, timing each wait for data."""
        try:
            self.state.batches_per_epoch = len(loader)  # type: ignore[arg-type]
        except TypeError:
            self.state.batches_per_epoch = None
        iterator = self._position(loader)
        for wrap in self._batch_wrappers:
            iterator = wrap(iterator)
        clock = time.perf_counter
        on_loaded = self._handlers[Event.BATCH_LOADED]
        while True:
            self._check_stop()
            started = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            wait_s = clock() - started
            self.state.batches_in_epoch += 1
            for handler in on_loaded:
                handler(self, batch, wait_s)
            yield batch

    def _position(self, loader: Iterable[Any]) -> Iterator[Any]:
        """A fresh epoch's iterator, or one that continues a restored epoch where it stopped."""
        from prudent.data import epoch_start_state, resume_iterator
        from prudent.rng import restore_rng

        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # DistributedSampler: never reset to epoch 0
            sampler.set_epoch(self.state.epoch)
        rng, self._resume_rng = self._resume_rng, None
        if rng is None or not self.state.batches_in_epoch or self.state.epoch_rng is None:
            if rng is not None:
                restore_rng(rng)
            self.state.batches_in_epoch = 0
            self.state.epoch_rng = epoch_start_state(loader)
            return iter(loader)
        return resume_iterator(loader, self.state.epoch_rng, self.state.batches_in_epoch,
                               after_skip=lambda: restore_rng(rng))

    def backward(self, loss: Any) -> None:
        """``loss.backward()`` (scaled when a GradScaler is attached), then gradient hooks."""
        (self._scaler.scale(loss) if self._scaler is not None else loss).backward()
        for handler in self._handlers[Event.AFTER_BACKWARD]:
            handler(self, loss)

    def step(self, **metrics: Any) -> None:
        """End of one optimisation step: metrics (numbers or 0-d tensors), rules, stop checks."""
        self.state.step += 1
        for handler in self._step_end:
            handler(self, metrics)
        if self._stop is not None and not self.defer_stops:
            self._raise_stop()

    def log(self, **metrics: Any) -> None:
        """Evaluation metrics (converted to floats now: they are rare and the tuner reads them)."""
        values = dict(zip(metrics, to_floats(metrics.values())))
        self._logged.update(values)
        self.emit(Event.LOG, values)
        self._check_stop()

    def host_scalar(self, value: Any) -> Any:
        """A 0-d tensor's number when reading it costs no wait (the tensor is on the CPU), read
        once however many components ask for the same tensor (the last few are remembered: the
        loss and a metric or two of a step); anything else comes back as is (a tensor on a
        device stays there: reading it would make the host wait)."""
        if not hasattr(value, "is_cpu"):
            return value
        for tensor, number in self._host_reads:
            if tensor() is value:
                return number
        if not value.is_cpu or value.dim() != 0:
            return value  # on a device, or several numbers: left as is
        number = value.item()
        self._host_reads = [*self._host_reads[-(_HOST_READS - 1):], (weakref.ref(value), number)]
        return number

    def capture(self, reason: str = "user", message: str = "",
                error: BaseException | None = None) -> None:
        """Ask for a failure bundle of this step (batch, state, RNG, stack; see prudent.debug).

        Safe from another thread: the bundle is then written at the loop's next step.
        """
        self.emit(Event.CAPTURE_REQUESTED, reason, message, error)

    @property
    def stop_requested(self) -> str | None:
        """The reason of a pending stop request, if any (the run stops at the next check)."""
        return self._stop[0] if self._stop is not None else None

    @property
    def pending_stop(self) -> tuple[str, str] | None:
        """``(reason, message)`` of the pending stop request, if any."""
        return self._stop

    def replace_stop(self, reason: str, message: str) -> None:
        """Set the stop every rank agreed on (it may differ from this rank's own request)."""
        self._stop = (reason, message)

    def request_stop(self, reason: str, message: str = "") -> None:
        """Ask the run to stop at the next step, batch or log; the first request wins.

        Safe to call from a signal handler or another thread: it only sets a field.
        """
        if self._stop is None:
            self._stop = (reason, message)

    def record_event(self, kind: str, name: str, message: str = "", step: int | None = None,
                     **payload: Any) -> None:
        """Put an event in the run's store record (written off the training thread)."""
        import json

        self.writer.put_event({
            "run_id": self.id, "step": self.state.step if step is None else step, "kind": kind,
            "name": name, "message": message, "payload": json.dumps(payload, default=str),
            "wall": time.time()})

    # stopping -----------------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self._stop is not None and not self.defer_stops:
            self._raise_stop()

    def _raise_stop(self) -> None:
        assert self._stop is not None
        reason, message = self._stop
        if not self._stop_announced:
            self._stop_announced = True
            self.record_event("lifecycle", "stop_requested", message or reason, reason=reason)
            self.emit(Event.STOP_REQUESTED, reason, message)
        raise StopRun(reason, message)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None:
            self._finish("completed", None)
            return False
        if isinstance(exc, KeyboardInterrupt):
            # a stop already requested (the stall watchdog interrupts the main thread) wins
            reason, message = self._stop or ("interrupted", "KeyboardInterrupt (Ctrl-C)")
            exc = StopRun(reason, message)
            if not self.exit_on_stop:
                self._finish("stopped", "interrupted", exc.message)
                return False
        if isinstance(exc, StopRun):
            self._finish("stopped", exc.reason, exc.message)
            if self.exit_on_stop:
                raise SystemExit(exc.exit_code)
            return True
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            self._finish("completed", None)
            return False
        self.capture("error", _describe(exc), error=exc)  # before END: the state is as it failed
        self._finish("failed", "error", _describe(exc), traceback=_trimmed_traceback(exc))
        return False

    def _finish(self, status: str, reason: str | None, message: str = "", **payload: Any) -> None:
        if self._closed:
            return
        self._closed = True
        self.status, self.stop_reason = status, reason
        self._signals.uninstall()
        self.emit(Event.END, status, reason)
        self.record_event("lifecycle", "end", message or status, status=status,
                          stop_reason=reason, **payload)
        self.writer.flush()
        self.writer.close()
        if self.store is not None:
            self.store.update_run(self.id, status=status, stop_reason=reason,
                                  ended_at=time.time(), exit_code=self.exit_code,
                                  step=self.state.step, epoch=self.state.epoch)
            self.store.close()  # releases connections; the store reopens them if used again
        atexit.unregister(self._finish_at_exit)

    def _finish_at_exit(self) -> None:
        """A script that never used ``with run:`` still leaves a truthful record."""
        if self._closed:
            return
        failed = getattr(sys, "last_value", None) or _UNCAUGHT.get("exc")
        if isinstance(failed, StopRun):
            self._finish("stopped", failed.reason, failed.message)
        elif failed is not None:
            self._finish("failed", "error", _describe(failed))
        else:
            self._finish("completed", None)

    @property
    def exit_code(self) -> int:
        """What the process should exit with, given how the run ended so far."""
        if self.status == "failed":
            return int(ExitCode.ERROR)
        return exit_code_for(self.stop_reason)


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


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _trimmed_traceback(exc: BaseException) -> str:
    """The traceback without prudent's own frames: the user's code is what matters."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f"{os.sep}prudent{os.sep}" not in f.filename]
    return "".join(traceback.format_list(frames[-10:])) + _describe(exc)


_UNCAUGHT: dict[str, BaseException] = {}


def _watch_uncaught_exceptions() -> None:
    """Remember an uncaught exception so the atexit fallback can record the run as failed."""
    previous = sys.excepthook
    if getattr(previous, "_prudent", False):
        return

    def remember(exc_type: type[BaseException], exc: BaseException,
                 tb: TracebackType | None) -> None:
        _UNCAUGHT["exc"] = exc
        previous(exc_type, exc, tb)

    remember._prudent = True  # type: ignore[attr-defined]
    sys.excepthook = remember
