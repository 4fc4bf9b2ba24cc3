"""Profiler: the component that times every step, samples the system and says what to change.

On the training thread it costs the loop next to nothing: the kernel notes when each batch
arrives and each step ends (:class:`~prudent.kernel.loop_times.LoopTimes`), and the profiler,
asleep in between, hands those stamps to its :class:`StepTimer` every few hundred steps or
fractions of a sampling interval (on a GPU it is called every step instead: it must sync the
device on some). The system sampler is a thread of its own; the diagnosis, the summary event,
``profile.json`` and the console line happen once, at the end.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from prudent.kernel.errors import StoreError
from prudent.kernel.events import Component, Event, EventKind
from prudent.kernel.loop_times import TOKENS, LoopTimes, batch_size, token_count
from prudent.kernel.pace import StepPace, steps_within
from prudent.profile.diagnosis import Facts, diagnose
from prudent.profile.sampler import MB, SystemSampler
from prudent.profile.settings import ProfileSettings
from prudent.profile.summary import build_summary, summary_line
from prudent.profile.timer import CHUNK, StepTimer
from prudent.profile.trace import TraceWindow

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["PROFILE_METRICS", "Profiler"]

clock = time.perf_counter
PROFILE_METRICS = "profile/"  # the sampler's series in the store: profile/cpu_pct, ...


class Profiler(Component):
    name = "profile"

    def __init__(self, settings: ProfileSettings | None = None, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.settings = settings or ProfileSettings()
        self.timer = StepTimer(self.settings.thresholds.outlier_factor, self.settings.warmup_steps)
        self.sampler = SystemSampler(self.settings.interval_s, self._progress,
                                     split=self.timer.breakdown)
        window = self.settings.window
        self.trace = TraceWindow(window) if window is not None else None
        self.summary: dict[str, Any] | None = None
        self.quiet = quiet
        self._stream = stream
        self._next_special = 1  # the next step that needs a look: the first, or the trace's
        self._first_seen = False
        self._held: list[tuple[float, dict[str, float]]] = []  # samples before the first step
        self._ending = False
        self._device = "cpu"
        self._cuda_index: int | None = None
        self._gpu_position: int | None = None  # the training GPU in the sampler's list
        self._sync: Any = None
        self._every = max(1, self.settings.sync_every)
        self._synced = [0, 0.0, 0.0]  # steps timed with a device sync: count, wait s, compute s
        self._trace_info: dict[str, Any] | None = None
        self._times: LoopTimes | None = None  # the kernel's stamps, when it keeps them for us
        self._pace = StepPace()
        self._run: RunContext | None = None

    # events: the hot path first -----------------------------------------------------------
    def on_batch_loaded(self, run: RunContext, batch: Any, wait_s: float) -> None:
        # on a GPU only (see _time_every_step): elsewhere the kernel notes the batch
        self.timer.batch_loaded(clock(), wait_s, batch_size(batch))

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        step = run.state.step
        if self._times is not None:  # asleep since the last call: the steps in between
            self._take_loop_times()
        elif self._sync is not None:  # CUDA
            self._device_step_end(step, metrics)
        else:
            tokens = metrics.get(TOKENS)
            self.timer.step_end(clock(), 0.0 if tokens is None else token_count(tokens))
        if step >= self._next_special:
            self._special(run, step, metrics)
        if self._times is not None:
            run.sleep_until(self, self._next_wake(step))

    def _take_loop_times(self) -> None:
        """The batches and step ends the kernel noted since the last call, timed now."""
        assert self._times is not None
        self.timer.replay(*self._times.take())

    def _next_wake(self, step: int) -> int:
        """The next step that needs a look (the trace window's), or when the stamps are due:
        a chunk of the outlier search, or a quarter of a sampling interval (the sampler's time
        split stays current)."""
        step_s = self._pace.seen(step, clock())
        due = min(CHUNK, max(1, steps_within(self.settings.interval_s / 2, step_s)))
        return min(self._next_special, step + due)

    def _device_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        """Time device work truly on one step in ``sync_every``: the step before drains the
        queue, the sampled one is timed."""
        phase = step % self._every
        synced = phase == 0 or phase == self._every - 1
        if synced:
            self._sync()
        tokens = metrics.get(TOKENS)
        compute = self.timer.step_end(clock(), 0.0 if tokens is None else token_count(tokens),
                                      synced)  # a drained queue looks like a stall: no outlier
        if phase == 0:
            self._synced[0] += 1
            self._synced[1] += self.timer.last_wait_s
            self._synced[2] += compute

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        if self._times is not None:
            self._take_loop_times()
        self.timer.logged(clock())

    def on_checkpoint_taken(self, run: RunContext, step: int) -> None:
        # the loop waited for the snapshot (and, when synchronous, the write): checkpoint time;
        # an asynchronous write that goes on in the background costs the loop nothing more
        if self.summary is None:  # not a save made after our on_end
            if self._times is not None:
                self._take_loop_times()
            self.timer.checkpoint_taken(clock(), getattr(run.checkpoints, "last_reason", None))

    # rare events --------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        self.timer.start(clock())
        if self._sync is None:  # not on a GPU (yet): the kernel notes batches and step ends
            self._times = run.keep_loop_times(self)
            run.subscribe(self, Event.BATCH_LOADED, False)
        self._run = run
        self.sampler.on_sample = lambda sample: self._record_sample(run, sample)
        self.sampler.start()
        if self.trace is not None and self.trace.window.start == 0:
            self._begin_trace(run, 0)

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        import torch

        for obj in objects.values():
            if isinstance(obj, torch.nn.Module):
                parameter = next(obj.parameters(), None)
                if parameter is not None:
                    self._use_device(parameter.device)
                    return

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        try:
            if self._times is not None:
                self._take_loop_times()
                run.keep_loop_times(self, False)
            self._count_samples()
            self._times = None
            self.timer.finish(clock())
            self._close_trace(run)
        finally:
            self._ending = True
            self.sampler.stop()
        try:
            self._report(run)
        except Exception as exc:  # the run's own end record matters more than its profile
            print(f"prudent: the profile of {run.id} could not be written: {exc!r}",
                  file=sys.stderr)

    # steps that need a look ---------------------------------------------------------------
    def _special(self, run: RunContext, step: int, metrics: dict[str, Any]) -> None:
        if not self._first_seen:
            self.timer.number_steps_from(step - 1)
            self._first_seen = True  # after: the sampler's thread then reads first_step
            if self._cuda_index is None:
                self._device_from_metrics(metrics)
            self._check_window_reachable(run, step)
        trace = self.trace
        if trace is not None and trace.state == "waiting" and step == trace.window.start:
            self._begin_trace(run, step)
        elif trace is not None and trace.state == "tracing":
            if step >= trace.window.stop:
                self._end_trace(run, step)
            else:
                trace.step()
        self._next_special = self._next_special_step(step)

    def _next_special_step(self, step: int) -> int:
        trace = self.trace
        if trace is None or trace.state in ("written", "skipped", "failed"):
            return sys.maxsize
        if trace.state == "tracing":
            return step + 1
        return trace.window.start if trace.window.start > step else sys.maxsize

    def _check_window_reachable(self, run: RunContext, step: int) -> None:
        trace, state = self.trace, run.state
        if trace is None or trace.state != "waiting":
            return
        # the planned optimizer steps where known (run.steps(n), a framework's plan: a step of
        # gradient accumulation is several batches), else epochs x batches
        last, plan = state.num_steps or 0, f"run.steps({state.num_steps})"
        if state.num_steps and state.num_epochs is not None:
            plan = f"{state.num_steps} optimizer steps planned"
        elif not last:
            last = (state.num_epochs or 0) * (state.batches_per_epoch or 0)
            plan = f"{state.num_epochs} epochs x {state.batches_per_epoch} batches"
        if trace.window.start < step - 1:
            self._skip_trace(run, f"the run resumed at step {step - 1}, after its start")
        elif last and trace.window.start >= last:
            self._skip_trace(run, f"training ends at step {last} at the latest ({plan})")

    # the trace window ---------------------------------------------------------------------
    def _begin_trace(self, run: RunContext, step: int) -> None:
        assert self.trace is not None
        try:
            self.trace.begin(self._cuda_index is not None, step)
            self.timer.excluding = True
        except Exception as exc:
            self.trace.state = "failed"
            self._trace_info = {"steps": str(self.trace.window), "message": f"failed: {exc!r}"}
            run.record_event(EventKind.PROFILE, "trace_failed", f"torch.profiler did not start: {exc!r}")

    def _end_trace(self, run: RunContext, step: int) -> None:
        assert self.trace is not None
        self.timer.excluding = False
        try:
            self._trace_info = self.trace.end(run.run_dir, step)
        except Exception as exc:
            self.trace.state = "failed"
            self._trace_info = {"steps": str(self.trace.window), "message": f"failed: {exc!r}"}
            run.record_event(EventKind.PROFILE, "trace_failed", f"the trace was not written: {exc!r}")
            return
        finally:  # writing the trace (seconds) is the profiler's stall, not the next step's
            self.timer.profiler_overhead(clock())
        info = self._trace_info
        run.record_event(EventKind.PROFILE, "trace", f"trace of steps {info['steps']} written to "
                         f"{info['trace']} (open it in ui.perfetto.dev); operators in "
                         f"{info['ops_table']}", **info)

    def _skip_trace(self, run: RunContext, why: str) -> None:
        assert self.trace is not None
        self.trace.state = "skipped"
        window = self.trace.window
        message = (f"--profile-steps {window} was not traced: {why}. Choose a window inside the "
                   "run, e.g. --profile-steps 10:20")
        self._trace_info = {"steps": str(window), "message": message}
        run.record_event(EventKind.PROFILE, "trace_skipped", message, steps=str(window))
        self._say(run, message)

    def _close_trace(self, run: RunContext) -> None:
        trace = self.trace
        if trace is None:
            return
        if trace.state == "tracing":  # the run ended inside the window: keep what was traced
            self._end_trace(run, run.state.step)
        elif trace.state == "waiting":
            self._skip_trace(run, f"the run ended at step {run.state.step}, before step "
                             f"{trace.window.start}")

    # the device ---------------------------------------------------------------------------
    def _use_device(self, device: Any) -> None:
        self._device = str(device)
        if device.type != "cuda":
            return
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        self._time_every_step()
        self._cuda_index = index
        self._gpu_position = self._sampled_gpu(index)
        if self.settings.sync_every:
            self._sync = lambda: torch.cuda.synchronize(index)
        self.sampler.device_memory = lambda: (torch.cuda.memory_allocated(index) / MB,
                                              torch.cuda.memory_reserved(index) / MB)

    def _time_every_step(self) -> None:
        """On a GPU the profiler syncs the device on some steps: it is called on every batch
        and step, and the kernel stops keeping stamps for it (those it kept are timed first)."""
        run, times = self._run, self._times
        if run is None or times is None:
            return
        self._take_loop_times()
        self._count_samples()
        run.keep_loop_times(self, False)
        self._times = None
        run.subscribe(self, Event.BATCH_LOADED, True)
        run.subscribe(self, Event.STEP_END, True)

    def _count_samples(self) -> None:
        """The samples and tokens the kernel counted while it kept the stamps."""
        if self._times is not None:
            self.timer.num_samples += self._times.samples
            self.timer.num_tokens += self._times.tokens
            self._times.samples, self._times.tokens = 0, 0.0

    def _sampled_gpu(self, index: int) -> int:
        import torch

        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
        except Exception:
            return index
        position = self.sampler.gpu_position(uuid)
        return index if position is None else position

    def _device_from_metrics(self, metrics: dict[str, Any]) -> None:
        for value in metrics.values():
            device = getattr(value, "device", None)
            if device is not None:
                self._use_device(device)
                return

    def _device_memory(self) -> tuple[float | None, float | None]:
        if self._cuda_index is None:
            return None, None
        import torch

        total = torch.cuda.get_device_properties(self._cuda_index).total_memory / MB
        return total, torch.cuda.max_memory_reserved(self._cuda_index) / MB

    def _record_sample(self, run: RunContext, sample: dict[str, Any]) -> None:
        """One sample into the run's record as ``profile/*`` metrics, so its timeline
        (throughput, utilisation, the time split over the run) is read from the store on any
        machine, not only from ``profile.json`` in the run's folder. Called on the sampler's
        thread.

        A sample is recorded at the run's step in progress (the last one done at the end),
        the step its trackers' curves share. A sample's own ``step`` counts this process's
        steps, and a resumed run's step is only known once its first step is done: samples
        taken before wait for it. Recorded at this process's count, a relaunch's samples
        would sit under the previous attempt's curve, and W&B, whose step only goes up,
        would refuse them."""
        wall, values = time.time(), _sample_values(sample)
        if not self._first_seen and not self._ending:
            self._held.append((wall, values))
            return
        before = self.timer.first_step if self._first_seen else run.state.step
        now = before + sample["step"] + (0 if self._ending else 1)
        rows = [(min(before + 1, now), held_wall, held) for held_wall, held in self._held]
        self._held = []
        run.writer.put_metrics(run.id, [*rows, (now, wall, values)], latest=False)

    # the end ------------------------------------------------------------------------------
    def _progress(self) -> tuple[int, int, float]:
        """Steps, samples and tokens so far (on the sampler's thread): the kernel's counts,
        current even while the profiler sleeps."""
        timer, times = self.timer, self._times
        if times is None:
            return timer.num_steps, timer.num_samples, timer.num_tokens
        return times.steps, timer.num_samples + times.samples, timer.num_tokens + times.tokens

    def _report(self, run: RunContext) -> None:
        facts = self._facts(run)
        findings = diagnose(facts, self.settings.thresholds)
        summary = build_summary(
            self.timer, self.sampler.samples, device=self._device,
            findings=[f.to_dict() for f in findings] + _recorded_findings(run),
            trace=self._trace_info,
            synced_steps=self._synced_summary(),
            gpu_note=self.sampler.gpu_note if self._cuda_index is not None else "",
            interval_s=self.settings.interval_s)
        self.summary = summary
        for finding in findings:
            run.record_event(EventKind.FINDING, finding.id, finding.message, **finding.evidence)
        line = summary_line(summary)
        run.record_event(EventKind.PROFILE, "summary", line, **summary)
        path = run.run_dir / "profile.json"
        temporary = path.with_name(".profile.json.tmp")  # a full disk leaves no cut-short file
        try:
            temporary.write_text(json.dumps({**summary, "timeline": self.sampler.samples},
                                            indent=1, default=str) + "\n")
            temporary.replace(path)
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
        self._say(run, line)

    def _facts(self, run: RunContext) -> Facts:
        timer = self.timer
        total_mb, peak_mb = self._device_memory()
        step_time = timer.step_time()
        return Facts(
            num_steps=timer.num_steps, breakdown=timer.breakdown(),
            step_median_s=step_time["median_s"] if step_time else None,
            num_evals=timer.num_evals, num_checkpoints=timer.num_checkpoints,
            checkpoint_reasons=dict(timer.checkpoint_reasons),
            outliers=timer.outliers, num_outliers=timer.num_outliers,
            outlier_excess_s=timer.outlier_excess_s,
            batches_per_epoch=run.state.batches_per_epoch, device=self._device,
            gpu_index=self._gpu_position, device_total_mb=total_mb,
            device_peak_reserved_mb=peak_mb, samples=self.sampler.samples)

    def _synced_summary(self) -> dict[str, Any] | None:
        count, wait, compute = self._synced
        if not count:
            return None
        return {"num_steps": count, "data_ms": round(1e3 * wait / count, 4),
                "compute_ms": round(1e3 * compute / count, 4), "every": self._every}

    def _say(self, run: RunContext, text: str) -> None:
        if not self.quiet and not run.refused:
            print(f"prudent | {run.id} | {text}", file=self._stream or sys.stderr, flush=True)


def _recorded_findings(run: RunContext) -> list[dict[str, Any]]:
    """Findings other components recorded during this attempt (under torchrun, the straggler
    watch's), so that the summary line and ``prudent profile`` do not say "no bottleneck
    found" beside them. Read back from the record, which only rank 0 has; a single process
    has no such finding and reads nothing."""
    if run.store is None or run.world_size < 2:
        return []
    run.writer.flush(timeout_s=5.0)
    try:
        events = run.store.events(run.id)
    except StoreError:
        return []  # the summary matters more than these
    return [{"id": e["name"], "message": e["message"], "evidence": e["payload"]} for e in events
            if e["kind"] == EventKind.FINDING.value and e["wall"] >= run.started_at]


def _sample_values(sample: dict[str, Any]) -> dict[str, float]:
    """A sample's readings as ``profile/*`` metric values."""
    values: dict[str, float] = {}
    for key, value in sample.items():
        if key in ("t", "step"):
            continue
        if key == "gpus":
            for index, gpu in enumerate(value):
                for name in ("util_pct", "mem_used_mb"):
                    if isinstance(gpu.get(name), (int, float)):
                        values[f"{PROFILE_METRICS}gpu{index}_{name}"] = float(gpu[name])
        elif isinstance(value, (int, float)):
            values[PROFILE_METRICS + key] = float(value)
    return values
