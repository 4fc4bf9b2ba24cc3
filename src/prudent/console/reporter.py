"""ConsoleReporter: what a person watching the run sees.

On a terminal, a rich progress bar (epoch and step, or step of ``run.steps(n)`` in a loop
without epochs; steps/s, last loss, ETA); when output goes to a file or a pipe (CI, a cluster
log), one plain line every ``interval_s`` seconds and at every ``run.log``. It reads floats
the store writer already converted, so it never syncs a device.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO

from prudent.console.settings import ConsoleSettings
from prudent.kernel.events import Component
from prudent.kernel.loop_times import TOKENS
from prudent.kernel.pace import StepPace, steps_within
from prudent.kernel.stop import StopKind

if TYPE_CHECKING:
    from rich.progress import Progress

    from prudent.kernel.context import RunContext
    from prudent.kernel.state import RunState
    from prudent.kernel.stop import StopReason

__all__ = ["ConsoleReporter"]


class ConsoleReporter(Component):
    name = "console"
    main_rank_only = True
    _REFRESH_S = 0.25

    def __init__(self, settings: ConsoleSettings | None = None, stream: TextIO | None = None):
        self.settings = settings or ConsoleSettings()
        self.stream = stream or sys.stderr
        mode = self.settings.mode
        if mode == "auto":
            mode = "rich" if self.stream.isatty() else "plain"
        self.mode = mode
        self._progress: Progress | None = None
        self._task: Any = None
        self._next_update = 0.0
        self._rate = _Rate()
        self._pace = StepPace()

    # events -------------------------------------------------------------------------------
    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        now, step = time.monotonic(), run.state.step
        if now >= self._next_update:
            self._rate.add(now, step)
            if self.mode == "rich":
                self._update_bar(run)
                self._next_update = now + self._REFRESH_S
            else:
                if self._next_update:  # not on the very first step
                    self._print(self._status_line(run))
                self._next_update = now + self.settings.interval_s
        # the steps before the next refresh pass without a call (the kernel counts them)
        waits = steps_within(self._next_update - now, self._pace.seen(step, now))
        if waits:
            run.sleep_until(self, step + waits)

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        values = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
        state = run.state  # "epoch 1" only where there are epochs: an iteration loop has none
        epoch = f"epoch {state.epoch + 1} " if state.num_epochs is not None else ""
        self._print(f"{epoch}step {state.step}: {values}", run)

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if run.refused:
            return  # nothing ran: the error that refused it is the one line to read
        elapsed = timedelta(seconds=round(time.time() - run.started_at))
        how = status if stop_reason is None else f"{status} ({stop_reason})"
        # run.step(tokens=n) is a count for tokens/s (the profile line), not a value to report
        latest = " ".join(f"{k}={_fmt(v)}" for k, v in sorted(run.latest.items()) if k != TOKENS)
        self._print(f"{how} after {elapsed}, {run.state.step} steps. {latest}".rstrip(), run)
        if run.id_was_made and stop_reason is not None and stop_reason.kind is StopKind.PREEMPTED:
            # the same command again would start afresh: the resume needs this run's id
            self._print(f"to resume it from its newest checkpoint, run: prudent run --run-id "
                        f"{run.id} -- {_this_command()}", run)

    # output -------------------------------------------------------------------------------
    def _print(self, text: str, run: RunContext | None = None) -> None:
        if self.mode == "off":
            return
        prefix = f"prudent | {run.id} | " if run is not None else "prudent | "
        if self._progress is not None:
            self._progress.console.print(prefix + text, markup=False, highlight=False)
        else:
            print(prefix + text if run is not None else text, file=self.stream, flush=True)

    def _status_line(self, run: RunContext) -> str:
        return f"prudent | {run.id} | " + " | ".join(self._fields(run))

    def _fields(self, run: RunContext) -> list[str]:
        fields = _position(run.state)
        rate = self._rate.per_s
        if rate:
            fields.append(f"{rate:.1f} steps/s")
        if "loss" in run.latest:
            fields.append(f"loss {_fmt(run.latest['loss'])}")
        if "cost_usd" in run.gauges:
            fields.append(f"${run.gauges['cost_usd']:.2f}")
        eta = self._eta_s(run, rate)
        if eta is not None:
            fields.append(f"eta {timedelta(seconds=round(eta))}")
        return fields

    @staticmethod
    def _eta_s(run: RunContext, rate: float | None) -> float | None:
        total, done = _progress(run.state)
        return max(0, total - done) / rate if rate and total else None

    def _update_bar(self, run: RunContext) -> None:
        if self._progress is None:
            self._start_bar(run)
        assert self._progress is not None
        total, done = _progress(run.state)
        self._progress.update(self._task, total=total, completed=done,
                              info=" | ".join(self._fields(run)))

    def _start_bar(self, run: RunContext) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._progress = Progress(TextColumn(f"[bold]{run.id}"), BarColumn(),
                                  TextColumn("{task.fields[info]}"),
                                  console=Console(file=self.stream), transient=False)
        self._task = self._progress.add_task(run.id, total=None, info="")
        self._progress.start()


def _position(state: RunState) -> list[str]:
    """``epoch 2/10``, ``step 412`` where the loop has epochs; ``step 412/5000`` (of
    ``run.steps(5000)``) or ``step 412`` where it has none."""
    if state.num_epochs is not None:
        epochs = f"/{state.num_epochs}" if state.num_epochs else ""
        return [f"epoch {state.epoch + 1}{epochs}", f"step {state.step}"]
    total = f"/{state.num_steps}" if state.num_steps else ""
    return [f"step {state.step}{total}"]


def _progress(state: RunState) -> tuple[int | None, int]:
    """Steps (or batches) to do in all, if known, and done so far."""
    if state.num_epochs is None:
        return state.num_steps or None, state.step
    if not (state.num_epochs and state.batches_per_epoch):
        return None, state.step
    done = state.epoch * state.batches_per_epoch + state.batches_in_epoch
    return state.num_epochs * state.batches_per_epoch, done


class _Rate:
    """Steps per second over the last few seconds."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: list[tuple[float, int]] = []

    def add(self, now: float, step: int) -> None:
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.pop(0)

    @property
    def per_s(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "nan"
    return f"{value:.4g}"


def _this_command() -> str:
    """This process's command line as typed (``python train.py --lr 3e-4``), for a user to
    run again under ``prudent run``."""
    import shlex

    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    return shlex.join(argv)
