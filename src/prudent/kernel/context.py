"""The RunContext: what components and framework adapters see of a run.

The user's :class:`~prudent.kernel.run.Run` keeps the user's verbs; everything a habit needs to
plug in is here: the counters (``state``), the record (``record_event``, the metrics sink
``writer``), the stop request (``request_stop`` with a :class:`~prudent.kernel.stop.StopReason`),
``emit`` to the components, typed shared values (``gauges``, ``stop_deadline``,
``defer_stops``), and ``start`` / ``finish`` for an adapter whose framework owns the loop.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Any

from prudent.kernel.errors import ConfigError, StopRun, StoreError
from prudent.kernel.events import Component, Event, EventKind
from prudent.kernel.loop_times import LoopTimes
from prudent.kernel.signals import SignalStopper
from prudent.kernel.state import RunState
from prudent.kernel.step_values import StepValues
from prudent.kernel.stop import ExitCode, StopKind, StopReason, exit_bad_input
from prudent.store.database import LOCKED_WAIT_S, Store, run_folder
from prudent.store.writer import NullWriter, StoreWriter

__all__ = ["RunContext"]

_HOST_READS = 4  # tensors a step reads whose host value host_scalar remembers


LossWatcher = Callable[["RunContext", Any, Any], None]  # (ctx, loss, its host value or tensor)


class RunContext:
    """One run as components see it. Built by :func:`prudent.init`; one per run.

    ``settings`` is the project's settings as ``prudent.init`` resolved them (the kernel never
    reads them; components read their own section). ``store`` is None on torchrun ranks other
    than 0: they write nothing.
    """

    def __init__(self, *, run_id: str, name: str, config: dict[str, Any], home: str | Path,
                 store: Store | None, writer: StoreWriter | NullWriter | None = None,
                 settings: Any = None, exit_on_stop: bool = True,
                 components: Iterable[Component] = (), handle_signals: bool = True) -> None:
        self.id = run_id
        self.name = name
        self.config = config
        self.settings = settings
        self.store = store
        self.writer: StoreWriter | NullWriter = writer or (
            StoreWriter(store) if store is not None else NullWriter())
        self.exit_on_stop = exit_on_stop
        # the number of ranks now (torchrun's WORLD_SIZE); state.world_size is the one the
        # counters were kept on, which a checkpoint from another world brings back
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.state = RunState(world_size=self.world_size)
        self.objects: dict[str, Any] = {}
        self.started_at = time.time()
        self.status = "running"
        self.stop_reason: StopReason | None = None  # how it ended, once it has
        # a component refused the run as it started (bad input: a checkpoint location that
        # cannot be written); its end says nothing on the console: the error does
        self.refused = False
        self.id_was_made = False  # the id was made for this launch: a relaunch must be given it
        # the step being ended is its epoch's last and the framework ends the epoch next (set
        # by an adapter: Lightning validates first): a save due now waits for the epoch's end,
        # a position the framework resumes exactly (see Checkpointer.on_step_end)
        self.epoch_end_follows = False
        self.gauges: dict[str, float] = {}  # live values a component publishes (cost_usd)
        self.stop_deadline: float | None = None  # time.time() by which a stop must be done
        self.defer_stops = False  # True while ranks must first agree (see distributed/torchrun.py)
        # under torchrun: prudent's own group over the ranks (a RankGroup, set by the stop
        # coordinator), the save every rank takes at this step's end, and rank 0's wish for one
        self.rank_group: Any = None
        self.save_agreed = False
        self.save_proposed = False
        # this step's end is one where every rank reads the agreement (about every 0.2 s):
        # a component's own collective (a straggler's timings) is safe in a later handler
        self.ranks_agreed = False
        self.logged: dict[str, float] = {}  # the newest value of each run.log metric
        self.batch_wrappers: list[Callable[[Iterator[Any]], Iterator[Any]]] = []
        self.resume_rng: dict[str, Any] | None = None  # applied once the data is repositioned
        # where a resumed loop starts again (a step's end, an epoch's or the loop's top):
        # (step, epoch, batches_in_epoch, epoch_samples_before, a clone of torch's generator:
        # see prudent.kernel.rng.kept_torch_state). A
        # checkpoint taken between two (inside run.log) holds these, not what the script drew
        # since (an evaluation on the global generator), so resuming from it re-does exactly
        # what the loop does again (see CheckpointManager.keep)
        self.boundary: tuple[int, int, int, int, Any] | None = None
        # the loop drew its epoch's last batch and runs the epoch's end (a scheduler's step, an
        # evaluation, run.log): a checkpoint now is one between epochs, holding the next
        # epoch's start (the loader's generators as this epoch left them), or a resume would
        # run this epoch's end again (the scheduler stepped twice). Set by run.batches
        self.epoch_drawn: dict[str, Any] | None = None
        # Python's and NumPy's generators at a boundary an evaluation is foreseen after (step,
        # states; see evaluated)
        self.boundary_generators: tuple[int, dict[str, Any]] | None = None
        self._generators_at = -1
        self._generators_every = False
        self._evaluated_at = (-1, -1)  # the boundaries of the last two evaluations
        self.carried: dict[str, Any] = {}  # run.carry's values by name: in the checkpoint, per rank
        # called on the training thread as a checkpoint is taken, before its write starts:
        # rows a component still holds go to the store writer, which the checkpoint's commit
        # then waits for (a checkpoint never outlives the metric rows of its steps)
        self.before_checkpoint: list[Callable[[RunContext], None]] = []
        # called on the checkpoint writer's thread once the store holds those rows, before the
        # checkpoint commits: the run's record in the bucket takes them (a new machine that
        # resumes from the checkpoint finds every row of the steps it does not train again)
        self.before_commit: list[Callable[[RunContext], None]] = []
        self.resume_carried: dict[str, Any] = {}  # the checkpoint's, for each name's first call
        from prudent.kernel.rng import torch_generator_keeper

        self._torch_rng_state = torch_generator_keeper()
        self.step_limit: int | None = None  # run.steps stops here (preflight's short loops)
        # the checkpointer, once started: keep(ctx, label) and restore(ctx, before_step=...)
        # for components that roll back or keep a best checkpoint (None: checkpoints are off)
        self.checkpoints: Any = None
        self._home = Path(home)
        self._handle_signals = handle_signals
        self._stop: StopReason | None = None
        self._stop_announced = False
        self._closed = False
        self.device: Any = None  # where the model lives, once run.device resolved it
        # the tensors read this step and their numbers (cleared when the step ends: a loss
        # must not keep its graph alive)
        self.host_reads: list[tuple[Any, Any]] = []
        self._components: list[Component] = []
        # each event's (component, handler) pairs in order; the lists the kernel iterates hold
        # those whose component neither muted itself (subscribe) nor was paused from outside
        self._registered: dict[Event, list[tuple[Component, Callable[..., None]]]] = {
            event: [] for event in Event}
        self._muted: dict[Event, set[int]] = {event: set() for event in Event}
        self._paused: set[int] = set()
        self.handlers: dict[Event, list[Callable[..., None]]] = {event: [] for event in Event}
        # components that asked not to be called at STEP_END (or AFTER_BACKWARD) before some
        # step (sleep_until): the kernel compares the step with wake_step (backward_wake_step)
        # once a step, and nothing else
        self.wake_step: float = math.inf
        self.backward_wake_step: float = math.inf
        self._sleepers: dict[tuple[int, Event], tuple[Component, int]] = {}
        self.sleep_requests: list[tuple[Component, int, Event]] = []
        # the loss watch (watch_loss): a host loss at or below loss_watch_above passes with one
        # comparison; loss_watched_step is the step whose loss was last compared
        self.loss_watch_above = math.inf
        self.loss_watched_step = -1
        self._watches: dict[int, tuple[Component, LossWatcher, float]] = {}
        self._watchers: list[tuple[LossWatcher, float]] = []  # those not paused
        # the newest step whose backward was announced, and its loss (see after_backward)
        self.backward_step = -1
        self.backward_loss: Any = None
        # the loop's timestamps (keep_loop_times): None while no component reads them
        self.loop_times: LoopTimes | None = None
        self._loop_times = LoopTimes()
        self._time_keeper: Component | None = None
        # one metric of each step (keep_step_values): None while no component reads it
        self.step_values: StepValues | None = None
        self._step_values: StepValues | None = None
        self._values_keeper: Component | None = None
        for component in components:
            self.add_component(component)
        self._signals = SignalStopper(self.request_stop)

    # components ---------------------------------------------------------------------------
    def add_component(self, component: Component) -> None:
        """Plug a component in; only the events it overrides will call it."""
        self._components.append(component)
        for event in Event:
            if component.overrides(event):
                self._registered[event].append((component, getattr(component, event.method_name)))
                self._refresh(event)

    def subscribe(self, component: Component, event: Event, on: bool = True) -> None:
        """Call ``component`` on ``event`` from now on (``on=False``: stop calling it).

        For a component that needs a per-step event only on some steps: a handler not called
        costs nothing, one called to return at once costs about a microsecond. Call it from
        another event's handler (or ``on_start``): the lists are the ones the kernel iterates.
        """
        muted = self._muted[event]
        if (id(component) not in muted) is on:
            return
        if on:
            muted.discard(id(component))
        else:
            muted.add(id(component))
        self._refresh(event)

    def sleep_until(self, component: Component, step: int, event: Event = Event.STEP_END) -> None:
        """Leave ``component`` out of STEP_END (or AFTER_BACKWARD) until the step counter
        reaches ``step`` (the step in progress, for AFTER_BACKWARD); a step no later than the
        next one wakes a sleeping component instead.

        For a component whose per-step handler would only look at a schedule (a save due in
        N steps or seconds, a progress line every few seconds, a gradient norm every few
        dozen steps): the kernel compares one number per step instead of calling it. Safe from
        any handler of the step: the request takes effect once the step's STEP_END handlers
        have all run.
        """
        self.sleep_requests.append((component, step, event))

    def watch_loss(self, component: Component, watcher: LossWatcher | None,
                   above: float = math.inf) -> None:
        """Before each backward, call ``watcher(ctx, loss, value)`` only for a loss worth a
        look: a host number above ``above``, NaN, or a value not on the host (``value`` is
        then the tensor). Every other step costs the kernel one comparison for all watchers
        together, not a call: for components that judge each step's loss before the update
        (loss_spike's skip, failure capture's non-finite check). Call again to move the
        threshold; ``watcher=None`` ends ``component``'s watch."""
        if watcher is None:
            self._watches.pop(id(component), None)
        else:
            self._watches[id(component)] = (component, watcher, above)
        self._refresh_watches()

    def keep_loop_times(self, component: Component, on: bool = True) -> LoopTimes:
        """Have the kernel note when each batch arrives and each step ends (``loop_times``),
        for ``component`` to read in bulk (``take()``) instead of a handler per batch and per
        step; ``on=False`` when it no longer reads them. While it is off or paused, nothing is
        noted. One reader per run (the profiler): ``take()`` empties the stamps, so a second
        caller takes the first one's place."""
        if on:
            self._time_keeper = component
        elif self._time_keeper is component:
            self._time_keeper = None
        self._refresh_loop_times()
        return self._loop_times

    def keep_step_values(self, component: Component, key: str, on: bool = True) -> StepValues:
        """Have the kernel note the metric ``key`` of every ``run.step`` (``step_values``), for
        ``component`` to read in bulk (``take()``) while it sleeps through the steps
        (:meth:`sleep_until`) instead of a handler per step; ``on=False`` when it no longer
        reads them. While it is off or paused, nothing is noted. One reader per run (the
        monitor, for the loss): a second caller, or another key, starts a list of its own."""
        values = self._step_values
        if on:
            if values is None or values.key != key:
                values = self._step_values = StepValues(key)
            self._values_keeper = component
        elif self._values_keeper is component:
            self._values_keeper = None
        self._refresh_step_values()
        return values if values is not None else StepValues(key)

    def _refresh_step_values(self) -> None:
        keeper = self._values_keeper
        kept = keeper is not None and id(keeper) not in self._paused
        self.step_values = self._step_values if kept else None

    def _keepable(self, value: Any) -> Any:
        """A step's value as StepValues keeps it: the host number of a CPU tensor, a device
        tensor detached from its graph, anything else as is."""
        value = self.host_scalar(value)
        detach = getattr(value, "detach", None)
        return detach() if detach is not None else value

    def wake(self, component: Component, event: Event = Event.STEP_END) -> None:
        """Call a component that sleeps (:meth:`sleep_until`) at this step's ``event`` after
        all: for a loss watcher that saw something worth a look. Not from a handler of that
        same event (the list the kernel iterates would change under it)."""
        if self._sleepers.pop((id(component), event), None) is not None:
            self.subscribe(component, event, True)
            self._next_wake()

    def _refresh_loop_times(self) -> None:
        keeper = self._time_keeper
        kept = keeper is not None and id(keeper) not in self._paused
        self.loop_times = self._loop_times if kept else None

    @property
    def loss_watchers(self) -> tuple[Component, ...]:
        """The components whose loss watch is on (not paused)."""
        return tuple(c for c, _, _ in self._watches.values() if id(c) not in self._paused)

    def _refresh_watches(self) -> None:
        """The watches of components not paused (see :meth:`pause`), and their lowest bar."""
        self._watchers = [(w, above) for c, w, above in self._watches.values()
                          if id(c) not in self._paused]
        self.loss_watch_above = min((above for _, above in self._watchers), default=math.inf)

    def before_backward(self, loss: Any) -> None:
        """The step's loss, before its backward (the last micro-step's): BEFORE_BACKWARD's
        handlers, then the loss watch. ``run.backward`` and the adapters whose framework has
        such a point both end here."""
        for handler in self.handlers[Event.BEFORE_BACKWARD]:
            handler(self, loss)
        watchers = self._watchers
        if watchers:
            self.loss_watched_step = self.state.step + 1
            value = self.host_scalar(loss)
            if value.__class__ is not float or not value <= self.loss_watch_above:
                for watcher, above in watchers:
                    if value.__class__ is not float or not value <= above:
                        watcher(self, loss, value)

    def after_backward(self, loss: Any) -> None:
        """The step's gradients exist, its update has not been made: noted (a component not
        called after every backward still knows this step's backward and loss), then
        AFTER_BACKWARD's handlers. ``run.backward`` and the adapters both end here."""
        step = self.backward_step = self.state.step + 1
        self.backward_loss = loss
        if step >= self.backward_wake_step:
            self._wake_sleepers(step, Event.AFTER_BACKWARD)
        for handler in self.handlers[Event.AFTER_BACKWARD]:
            handler(self, loss)

    def end_step(self, metrics: dict[str, Any]) -> None:
        """One optimizer step done: counted, STEP_END delivered (the loop's ``run.step`` and
        the adapters' per-step hook both end here)."""
        times = self.loop_times
        if times is not None:  # before any handler: the step's own end
            times.step_ended(time.perf_counter(), metrics)
        state = self.state
        state.step += 1
        kept = self.step_values
        if kept is not None:  # before any handler: the reader may be woken at this step
            value = metrics.get(kept.key)
            kept.steps.append(state.step)
            kept.values.append(value if value.__class__ is float or value is None
                               else self._keepable(value))
        if state.step >= self.wake_step:
            self._wake_sleepers(state.step, Event.STEP_END)
        for handler in self.handlers[Event.STEP_END]:
            handler(self, metrics)
        self.mark_boundary()
        if self.host_reads:
            self.host_reads.clear()  # the step's tensors are not kept past it
        if self.sleep_requests:
            self._put_to_sleep()

    def _put_to_sleep(self) -> None:
        step = self.state.step
        for component, until, event in self.sleep_requests:
            key = (id(component), event)
            if until > step + 1:  # sleeping through no step is not worth the bookkeeping
                self._sleepers[key] = (component, until)
                self.subscribe(component, event, False)
            elif self._sleepers.pop(key, None) is not None:
                self.subscribe(component, event, True)
        self.sleep_requests.clear()
        self._next_wake()

    def _next_wake(self) -> None:
        wake = backward = math.inf
        for (_, event), (_, until) in self._sleepers.items():
            if event is Event.STEP_END:
                wake = min(wake, until)
            else:
                backward = min(backward, until)
        self.wake_step, self.backward_wake_step = wake, backward

    def _wake_sleepers(self, step: int, event: Event) -> None:
        for key, (component, until) in list(self._sleepers.items()):
            if key[1] is event and until <= step:
                del self._sleepers[key]
                self.subscribe(component, event, True)
        self._next_wake()

    def is_subscribed(self, component: Component, event: Event) -> bool:
        return any(c is component for c, _ in self._registered[event]) and (
            id(component) not in self._muted[event])

    def pause(self, components: Iterable[Component], paused: bool = True) -> None:
        """Take components out of every event (or put them back) without their knowing:
        for instruments such as the overhead benchmark's on/off blocks."""
        ids = {id(c) for c in components}
        self._paused = self._paused | ids if paused else self._paused - ids
        for event in Event:
            self._refresh(event)
        self._refresh_watches()
        self._refresh_loop_times()
        self._refresh_step_values()

    def wrap_handlers(self, wrap: Callable[[Callable[..., None]], Callable[..., None]],
                      events: Iterable[Event] = tuple(Event)) -> None:
        """Replace each handler of ``events`` with ``wrap(handler)`` (a timer, a tracer)."""
        for event in events:
            self._registered[event] = [(c, wrap(h)) for c, h in self._registered[event]]
            self._refresh(event)

    def _refresh(self, event: Event) -> None:
        off = self._muted[event] | self._paused
        self.handlers[event][:] = [h for c, h in self._registered[event] if id(c) not in off]

    @property
    def components(self) -> tuple[Component, ...]:
        return tuple(self._components)

    def emit(self, event: Event, *args: Any) -> None:
        """Deliver an event to every component handling it."""
        for handler in self.handlers[event]:
            handler(self, *args)

    def wrap_batches(self, wrapper: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
        """Change what ``run.batches`` yields, for every epoch from now on.

        For components that must steer the loop without editing the script: preflight's short
        epochs, replay's captured batch. ``wrapper`` gets the epoch's (already repositioned)
        iterator and returns the one the loop sees; wrappers apply in the order they were added.
        """
        self.batch_wrappers.append(wrapper)

    # where and what -----------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        """``$PRUDENT_HOME/runs/<id>``: this run's files (checkpoints, traces, reports)."""
        path = run_folder(self._home, self.id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def latest(self) -> dict[str, float]:
        """The newest float value of each metric (step metrics lag by at most a flush)."""
        return {**self.writer.latest, **self.logged}

    def host_scalar(self, value: Any) -> Any:
        """A 0-d tensor's number when reading it costs no wait (the tensor is on the CPU), read
        once however many components ask for the same tensor (the last few are remembered: the
        loss and a metric or two of a step); anything else comes back as is (a tensor on a
        device stays there: reading it would make the host wait)."""
        if value.__class__ is float:
            return value
        reads = self.host_reads
        for tensor, number in reads:
            if tensor is value:
                return number
        if not hasattr(value, "is_cpu") or not value.is_cpu or value.dim() != 0:
            return value  # not a tensor, on a device, or several numbers: left as is
        number = value.item()
        if len(reads) < _HOST_READS:
            reads.append((value, number))
        return number

    def capture(self, reason: str = "user", message: str = "",
                error: BaseException | None = None) -> None:
        """Ask for a failure bundle of this step (see prudent.debug); safe from another thread."""
        self.emit(Event.CAPTURE_REQUESTED, reason, message, error)

    # the record ---------------------------------------------------------------------------
    def record_event(self, kind: EventKind | str, name: str, message: str = "",
                     step: int | None = None, **payload: Any) -> None:
        """Put an event in the run's record (written off the training thread). ``kind`` and
        ``name`` are listed in :data:`prudent.kernel.events.RECORDED_EVENTS`."""
        self.writer.put_event({
            "run_id": self.id, "step": self.state.step if step is None else step,
            "kind": kind.value if isinstance(kind, Enum) else kind, "name": name,
            "message": message, "payload": json.dumps(payload, default=str), "wall": time.time()})

    def mark_boundary(self) -> None:
        """The loop is where a resumed one would start again (see ``boundary``)."""
        state = self.state
        self.boundary = (state.step, state.epoch, state.batches_in_epoch,
                         state.epoch_samples_before, self._torch_rng_state())
        if (state.step == self._generators_at or self._generators_every
                or self.boundary_generators is None):
            from prudent.kernel.rng import host_generators

            self.boundary_generators = (state.step, host_generators())

    def evaluated(self) -> None:
        """An evaluation was logged (said by the component that may keep a checkpoint at it:
        early stopping). A checkpoint kept there must hold Python's and NumPy's generators as
        of the boundary before it (a resumed loop does the evaluation again), but reading
        them costs ~50 us, too dear for every step: they are read at the first boundary,
        then at every one until the second evaluation, and from then on at the boundary the
        last two evaluations' spacing foresees (nanoGPT's ``eval_interval``); an evaluation
        that comes elsewhere has them read at every boundary again until the next one."""
        if self.boundary is None:
            return
        at = self.boundary[0]
        last, newest = self._evaluated_at
        if at == newest:
            return  # another run.log of the same evaluation
        foreseen = at == self._generators_at
        self._evaluated_at = last, newest = newest, at
        self._generators_every = last < 0 or not (foreseen or self._generators_every)
        self._generators_at = newest + (newest - last) if last >= 0 else -1

    def state_dict(self) -> dict[str, Any]:
        """Counters, RNG states and every component's state: all a checkpoint needs of the run."""
        from prudent.kernel.rng import capture_rng

        return {"state": self.saved_state(), "rng": capture_rng(),
                "components": {c.name: c.state_dict() for c in self._components}}

    def saved_state(self) -> dict[str, Any]:
        """The counters as a checkpoint taken now holds them: at an epoch's end before the
        epoch is counted (``epoch_drawn``), the next epoch's start."""
        state = self.state.state_dict()
        if self.epoch_drawn is not None:
            state.update(self.epoch_drawn, batches_in_epoch=0, epoch_samples_before=0)
        return state

    @property
    def position(self) -> tuple[int, int, int]:
        """(step, epoch, batches_in_epoch) as a checkpoint taken now holds them."""
        state, drawn = self.state, self.epoch_drawn
        if drawn is not None:
            return state.step, drawn["epoch"], 0
        return state.step, state.epoch, state.batches_in_epoch

    @property
    def resume_boundary(self) -> tuple[int, int, int, int, Any] | None:
        """The boundary a checkpoint taken between two steps resumes from (see ``boundary``);
        None at an epoch's end, whose checkpoint resumes at the next epoch's start."""
        return self.boundary if self.epoch_drawn is None else None

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
        self.resume_rng = state.get("rng")

    # stopping -----------------------------------------------------------------------------
    def request_stop(self, reason: StopReason | StopKind | str, message: str = "") -> None:
        """Ask the run to stop at the next step, batch or log (in an epoch's end, when
        ``run.epochs`` moves on); the first request wins.

        Safe from a signal handler or another thread: it only sets a field. A string is read
        as a ``stop_reason`` (``"preempted"``, ``"rule:loss_not_decreasing"``).
        """
        if self._stop is None:
            self._stop = _as_reason(reason, message)

    @property
    def pending_stop(self) -> StopReason | None:
        """The pending stop request, if any (the run stops at the next check)."""
        return self._stop

    @property
    def stop_requested(self) -> str | None:
        """The ``stop_reason`` string of a pending stop request, if any."""
        return str(self._stop) if self._stop is not None else None

    def replace_stop(self, reason: StopReason) -> None:
        """Set the stop every rank agreed on (it may differ from this rank's own request)."""
        self._stop = reason

    def check_stop(self) -> None:
        """Raise :class:`StopRun` when a stop is pending (and ranks need not agree first)."""
        if self._stop is not None and not self.defer_stops:
            self.raise_stop()

    def raise_stop(self) -> None:
        reason = self._stop
        assert reason is not None
        if not self._stop_announced:
            self._stop_announced = True
            self.record_event(EventKind.LIFECYCLE, "stop_requested", reason.message or str(reason),
                              reason=str(reason), stop_kind=reason.kind.value, rule=reason.rule)
            self.emit(Event.STOP_REQUESTED, reason)
        raise StopRun(reason)

    # start and finish ---------------------------------------------------------------------
    def start(self) -> None:
        """Install the signal handler, record the start and tell the components."""
        from prudent.launch.spec import host_name

        if self._handle_signals:
            self._signals.install()
        atexit.register(self._finish_at_exit)
        _watch_uncaught_exceptions()
        self.record_event(EventKind.LIFECYCLE, "start",
                          f"run {self.id} started on {host_name()}", pid=os.getpid())
        try:
            self.emit(Event.START)
        except ConfigError:
            self.refused = True
            raise

    def finish(self, status: str, reason: StopReason | None = None, message: str = "",
               *, notify: bool = True, **payload: Any) -> None:
        """Close the run once: tell the components (unless ``notify`` is False: the training
        thread is stuck and they cannot be trusted to return), write the end to the record."""
        if self._closed:
            return
        self._closed = True
        self.status, self.stop_reason = status, reason
        try:  # the handler stays until the end is written: a SIGTERM now (torchrun's, once
            # another rank failed) must not kill the process between the END and the record
            if notify:
                self.emit(Event.END, status, reason)
            stop_reason = str(reason) if reason is not None else None
            payload.setdefault("epochs", self.state.num_epochs)  # None: a loop without epochs
            self.record_event(EventKind.LIFECYCLE, "end", message or status, status=status,
                              stop_reason=stop_reason, **payload)
            self.writer.flush(timeout_s=30.0 if notify else 5.0)
            if notify:
                self.writer.close()
            if self.store is not None and not getattr(self.writer, "registration_pending", False):
                self._close_record(status, stop_reason, notify)  # (unregistered: none to close)
        finally:
            self._signals.uninstall()
        atexit.unregister(self._finish_at_exit)

    def _close_record(self, status: str, stop_reason: str | None, notify: bool) -> None:
        """The run's end in the store; a store that stays away does not turn a run that
        trained into a failure (the supervisor, or the next attempt, closes the record)."""
        try:  # a lock held past the writer's close (it waited for it): the record's final
            # heartbeat tells the end, imported at the next start
            with self.store.waiting_at_most(LOCKED_WAIT_S):  # type: ignore[union-attr]
                self.store.update_run(self.id, status=status, stop_reason=stop_reason,  # type: ignore[union-attr]
                                      ended_at=time.time(), exit_code=self.exit_code,
                                      step=self.state.step, epoch=self.state.epoch)
        except StoreError as exc:
            print(f"prudent | {self.id} | warning: the run ended {status} but its record could "
                  f"not be closed: {exc}", file=sys.stderr, flush=True)
        if notify:
            self.store.close()  # type: ignore[union-attr]  # the store reopens them if used

    def fail(self, exc: BaseException) -> None:
        """The loop raised: a failure bundle of the state as it failed, then the record."""
        self.capture("error", describe(exc), error=exc)
        self.finish("failed", StopReason(StopKind.ERROR, None, describe(exc)), describe(exc),
                    traceback=trimmed_traceback(exc))

    def refuse(self, exc: ConfigError) -> None:
        """Bad input found once the run had started (ranks that resumed from different
        checkpoints, a data position that cannot be carried over): nothing more is trained,
        the record says why, and the process exits 2 (``exit_on_stop=False``: raises)."""
        self.refused = True
        self.finish("failed", StopReason(StopKind.ERROR, None, f"bad input: {exc}"),
                    f"bad input: {exc}")
        if not self.exit_on_stop:
            raise exc
        exit_bad_input(str(exc))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def exit_code(self) -> int:
        """What the process should exit with, given how the run ended so far."""
        if self.status == "failed":
            return int(ExitCode.BAD_INPUT if self.refused else ExitCode.ERROR)
        if self.status == "completed":  # early stopping's too: the training is done
            return 0
        return self.stop_reason.exit_code if self.stop_reason is not None else 0

    def _finish_at_exit(self) -> None:
        """A script that never used ``with run:`` still leaves a truthful record."""
        if self._closed:
            return
        failed = uncaught_exception()
        if isinstance(failed, StopRun):
            self.finish("stopped", failed.stop, failed.message)
        elif isinstance(failed, KeyboardInterrupt):  # Ctrl-C through a framework's fit: as in
            reason = self.pending_stop or StopReason(  # `with run:`, a stop, not a failure
                StopKind.INTERRUPTED, None, "KeyboardInterrupt (Ctrl-C)")
            self.finish("stopped", reason, reason.message)
        elif failed is not None:
            self.finish("failed", StopReason(StopKind.ERROR, None, describe(failed)),
                        describe(failed))
        else:
            self.finish("completed")


def _as_reason(reason: StopReason | StopKind | str, message: str) -> StopReason:
    if isinstance(reason, StopKind):
        return StopReason(reason, None, message)
    if isinstance(reason, StopReason):
        return reason if not message or reason.message else dataclasses.replace(
            reason, message=message)
    return StopReason.parse(reason, message)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# prudent's own modules: the package above this kernel folder
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def trimmed_traceback(exc: BaseException) -> str:
    """The traceback without prudent's own frames: the user's code is what matters. prudent's
    frames are those of its installed package's files (not any path with "prudent" in it:
    a project folder named prudent, a clone of this repository, keeps its frames)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.abspath(f.filename).startswith(_PACKAGE_DIR)]
    return "".join(traceback.format_list(frames[-10:])) + describe(exc)


_UNCAUGHT: dict[str, BaseException] = {}


def uncaught_exception() -> BaseException | None:
    """The exception the process is ending with, if one escaped the script (or ``None``)."""
    return getattr(sys, "last_value", None) or _UNCAUGHT.get("exc")


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
