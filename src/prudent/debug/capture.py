"""FailureCapture: the component that writes a bundle at the moment a step goes wrong.

Three triggers, one bundle per failure:

- a non-finite loss or gradient, seen on ``after_backward``: the optimizer has not stepped, so
  the saved weights are the ones that produced it (the monitor's ``non_finite`` rule only sees
  it at its next check, after the update). With the loss alone to check (the default), the
  kernel's loss watch compares each step's loss and calls this component after backward only
  for one that is not finite;
- an exception leaving ``with run:`` (``run.capture("error", ...)`` from the kernel);
- ``run.capture(reason)``: the monitor's ``capture`` action, or the user. From another thread
  (the stall watchdog) the request waits for the loop's next step or the end of the run.

Per step it keeps a reference to the batch (no copy), the dataset indices behind it and the
RNG states at its arrival, so the bundle can feed ``prudent replay`` the exact step.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from prudent.checkpoint.objects import state_of
from prudent.debug.bundle import format_size, write_bundle
from prudent.debug.environment import environment, git_state, user_traceback
from prudent.debug.probe import (
    SampleIndexRecorder,
    index_list,
    local_shard,
    non_finite_grads,
    non_finite_rows,
)
from prudent.debug.settings import DebugSettings
from prudent.distributed.torchrun import ranks_from_env
from prudent.kernel.events import Component, Event, EventKind
from prudent.kernel.rng import capture_rng
from prudent.wiring.hparams import untracked

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["FailureCapture", "capture_folder"]

# requests of these reasons describe the same failure as the first non-finite step
_SAME_FAILURE = {"rule:non_finite": "non_finite"}
_NO_GRADS: tuple[str, ...] = ()  # a step's non-finite gradients, until one is found
_VERIFY_BATCHES = 8  # the first batches: do the steps draw random numbers?
_REVERIFY_EVERY = 256  # after that, one batch in this many looks again
_KEPT_INDICES = 64  # sampler outputs kept for a bundle (more when workers draw further ahead)
_DEFAULT_GENERATOR = torch.default_generator


def capture_folder(run: RunContext) -> Path:
    return run.run_dir / "captures"


class FailureCapture(Component):
    name = "capture"

    def __init__(self, settings: DebugSettings | None = None, stream: Any = None,
                 quiet: bool = False) -> None:
        self.settings = settings or DebugSettings()
        self.stream = stream
        self.quiet = quiet
        self._check_gradients = self.settings.check_gradients or self.settings.enabled
        mode = self.settings.on_non_finite
        self._check_loss = mode != "off" and self.settings.capture
        self._check_on_device = mode == "always" or self.settings.enabled  # a sync per step
        self.written: list[str] = []  # bundle paths, in order
        self._kinds_done: dict[str, str] = {}  # failure kind -> bundle path
        self._params: list[tuple[str, torch.Tensor]] = []
        self._sharded = False  # a parameter is a DTensor: bundles hold this rank's shards
        self._amp = False
        self._batch: Any = None
        # the sampler's outputs of the epoch in progress, and where its iterator began
        # (epoch, batches already in it: a resumed epoch skips some)
        self._recorder: SampleIndexRecorder | None = None
        self._recorder_began = (0, 0)
        self._state: Any = None
        self._rng: tuple[Any, Any] | None = None  # (CPU generator clone, CUDA states)
        self._num_batches = 0
        self._step_draws = False  # True once a step was seen drawing random numbers
        self._verifying = False  # this step's generators are compared at its end
        self._loss: Any = None
        self._bad_grads: list[str] | tuple[str, ...] = _NO_GRADS
        self._phase = "setup"  # setup | forward | after_backward | step_end
        self._position = (0, 0)
        self._loop_thread: int | None = None
        self._pending: list[tuple[str, str]] = []
        self._rank = ranks_from_env()
        # the non-finite check rides on the kernel's loss watch (one comparison a step; this
        # component is called after backward only for a loss that is not a finite number)
        # until the loop shows it cannot: a loss that is not a host number, an adapter's loop
        self._watching = False

    # events -------------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        self._loop_thread = threading.get_ident()
        self._state = run.state
        run.wrap_batches(self._record_indices)
        if self._check_loss and not self._check_gradients:
            self._watching = True
            run.watch_loss(self, self._loss_watched, sys.float_info.max)  # inf is above it
            run.subscribe(self, Event.AFTER_BACKWARD, False)

    def _loss_watched(self, run: RunContext, loss: Any, value: Any) -> None:
        if value.__class__ is float:  # NaN or infinite: captured after backward, as ever
            run.subscribe(self, Event.AFTER_BACKWARD, True)
            return
        # a tensor: several numbers (judged after every backward), or one on a device (then
        # only if the user accepts a wait per step)
        self._stop_watching(run, every_backward=value.is_cpu or self._check_on_device)

    def _stop_watching(self, run: RunContext, every_backward: bool) -> None:
        self._watching = False
        run.watch_loss(self, None)
        run.subscribe(self, Event.AFTER_BACKWARD, every_backward)

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        seen = {id(p) for _, p in self._params}
        modules = [k for k, o in objects.items() if isinstance(o, torch.nn.Module)]
        for key, obj in objects.items():
            if isinstance(obj, torch.nn.Module):
                prefix = f"{key}." if len(modules) > 1 else ""
                self._params += [(prefix + n, p) for n, p in obj.named_parameters()
                                 if p.requires_grad and id(p) not in seen]
                self._sharded = self._sharded or any(local_shard(p) is not p
                                                     for _, p in self._params)
                seen.update(id(p) for p in obj.parameters())
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled():
                self._amp = True  # inf gradients are then the scaler's business, not a failure

    def _record_indices(self, iterator: Any) -> Any:
        """Note the sampler's outputs as the loader draws them (the iterator itself is not
        wrapped: nothing is done per batch; a bundle looks its batch's indices up)."""
        self._recorder = SampleIndexRecorder.install(iterator, keep=_KEPT_INDICES)
        state = self._state
        self._recorder_began = (state.epoch, state.batches_in_epoch) if state else (0, 0)
        return iterator

    def _raw_indices(self) -> Any:
        """The sampler's output for the batch of the step in progress (None: not known)."""
        epoch, batch = self._position
        began_epoch, began_at = self._recorder_began
        if self._recorder is None or epoch != began_epoch or batch <= began_at:
            return None
        return self._recorder.indices_of(batch - began_at)

    def on_batch_loaded(self, run: RunContext, batch: Any, wait_s: float) -> None:
        # The generators as the step starts, for an exact replay. A step that draws no random
        # numbers (no dropout...) leaves them as they are: then the state at a failure is the
        # state at the start, and no copy is needed on every batch. Whether steps draw is
        # seen on the first batches and checked again now and then.
        n = self._num_batches = self._num_batches + 1
        if self._step_draws or n <= _VERIFY_BATCHES or n % _REVERIFY_EVERY == 0:
            self._rng, self._verifying = _step_rng(), not self._step_draws
        else:
            self._rng = None
        self._batch, self._phase = batch, "forward"
        self._loss, self._bad_grads = None, _NO_GRADS
        state = run.state
        self._position = (state.epoch, state.batches_in_epoch)

    def on_after_backward(self, run: RunContext, loss: Any) -> None:
        self._phase = "after_backward"
        self._loss = loss  # detached only if a bundle is written
        if self._watching:
            run.subscribe(self, Event.AFTER_BACKWARD, False)  # this step only
        if not self._check_loss or "non_finite" in self._kinds_done:
            return  # one bundle per failure: the steps after the first are not new ones
        problem = self._non_finite(run, loss)
        if problem is not None:
            self._capture(run, "non_finite", problem)

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        step = run.state.step
        no_backward = run.backward_step != step  # the loop called loss.backward() itself
        late = "the loop does not call run.backward"
        if self._watching and run.loss_watched_step != step:
            # no loss before backward (an adapter's loop, or no run.backward): the loss watch
            # cannot see it; this step's loss is judged below, the next ones after backward
            self._stop_watching(run, every_backward=True)
            if not no_backward:
                no_backward, metrics = True, {"loss": run.backward_loss}
                late = "the loop announces its loss after backward only: its first step"
        self._phase = "step_end"
        if self._verifying:
            self._verifying = False
            self._step_draws = self._rng is not None and _drew(self._rng)
        if no_backward and self._check_loss and "non_finite" not in self._kinds_done:
            loss = metrics.get("loss")
            if loss is not None:
                self._loss = loss
                problem = self._non_finite(run, loss)
                if problem is not None:  # seen only now, after the update: the bundle says so
                    self._capture(run, "non_finite", f"{problem} (seen at run.step: {late}, "
                                  "so after the update)")
        if self._pending:
            self._take_pending(run)

    def on_capture_requested(self, run: RunContext, reason: str, message: str,
                             error: BaseException | None) -> None:
        if not self.settings.capture or (error is not None and not self.settings.on_error):
            return
        if threading.get_ident() != self._loop_thread:
            self._pending.append((reason, message))  # the loop's state is not ours to read now
            return
        self._capture(run, reason, message, error)

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        self._take_pending(run)

    def _take_pending(self, run: RunContext) -> None:
        while self._pending:
            reason, message = self._pending.pop(0)
            self._capture(run, reason, message)

    # detection ----------------------------------------------------------------------------
    def _non_finite(self, run: RunContext, loss: Any) -> str | None:
        value = run.host_scalar(loss)  # a CPU loss read once for every component that asks
        if value.__class__ is float and value - value == 0.0 and not self._check_gradients:
            return None  # the common step: a finite number (inf - inf and NaN are NaN)
        if isinstance(value, torch.Tensor):  # on a device, or more than one number
            value = value.detach()
            if not value.is_cpu and not self._check_on_device:
                return None  # reading it would make the host wait for the device at every step
            finite = bool(torch.isfinite(value).all())
        else:
            finite = math.isfinite(float(value))
        if not finite:
            return f"loss is {_scalar(value)}"
        if self._amp or not self._params or not self._check_gradients:
            return None
        self._bad_grads = non_finite_grads(self._params)
        if not self._bad_grads:
            return None
        names = ", ".join(self._bad_grads[:5]) + (" ..." if len(self._bad_grads) > 5 else "")
        return f"gradients are not finite in {names} (loss {_scalar(value)})"

    # writing ------------------------------------------------------------------------------
    def _capture(self, run: RunContext, reason: str, message: str,
                 error: BaseException | None = None) -> None:
        """Write one bundle; never raises (a failing capture must not hide the failure)."""
        kind = _SAME_FAILURE.get(reason, reason)
        if kind in self._kinds_done:
            run.record_event(EventKind.CAPTURE, "skipped", f"{reason}: this failure was already captured "
                             f"to {self._kinds_done[kind]}", path=self._kinds_done[kind])
            return
        if len(self.written) >= self.settings.keep:
            run.record_event(EventKind.CAPTURE, "skipped", f"{reason}: this run already wrote "
                             f"{len(self.written)} bundles (debug.keep={self.settings.keep})")
            return
        try:
            self._write(run, kind, reason, message, error)
        except Exception as exc:  # noqa: BLE001 - report it, keep the original failure visible
            self._kinds_done[kind] = "nowhere (the capture failed)"  # not once per step after it
            text = f"capture at step {run.state.step} failed: {type(exc).__name__}: {exc}"
            run.record_event(EventKind.CAPTURE, "failed", text)
            self._say(run, f"warning: {text}")

    def _write(self, run: RunContext, kind: str, reason: str, message: str,
               error: BaseException | None) -> None:
        if self._phase != "after_backward" and run.backward_step == run.state.step + 1:
            # a step whose backward ran without calling us (the loss watch saw it finite)
            self._phase, self._loss = "after_backward", run.backward_loss
        in_step = self._phase in ("forward", "after_backward")
        step = run.state.step + 1 if in_step else run.state.step
        info = self._info(run, step, in_step, reason, message, error)
        name = f"step-{step}" + (f"-rank{self._rank.rank}" if self._rank.is_distributed else "")
        run_state = {"state": run.state.state_dict(),
                     "rng": self._rng_at_step_start(in_step),
                     "loss": self._loss.detach() if isinstance(self._loss, torch.Tensor)
                     else None}
        objects = {k: state_of(v) for k, v in run.objects.items()}
        if self._sharded:
            objects = _local_shards(objects)
        written = write_bundle(capture_folder(run), name, info, self._batch, run_state,
                               objects, int(self.settings.max_bytes))
        self.written.append(written.path)
        self._kinds_done[kind] = written.path
        self._announce(run, info, written)

    def _rng_at_step_start(self, in_step: bool) -> dict[str, Any]:
        if self._rng is not None:
            return _rng_dict(self._rng)
        if in_step and self._num_batches and not self._step_draws:
            return _rng_dict(_step_rng())  # steps draw nothing: the state now is the start's
        return capture_rng()

    def _info(self, run: RunContext, step: int, in_step: bool, reason: str, message: str,
              error: BaseException | None) -> dict[str, Any]:
        rows = non_finite_rows(self._batch) if self._batch is not None else {}
        indices = index_list(self._raw_indices())
        offending = [{"row": row, "sample_index": indices[row] if indices and row < len(indices)
                      else None, "tensors": where} for row, where in sorted(rows.items())]
        epoch, batch_in_epoch = self._position
        return {
            "run_id": run.id, "run_name": run.name, "reason": reason, "message": message,
            "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
            "phase": self._phase,
            "state_when": "before_update" if in_step else "after_update",
            "loss": _scalar(self._loss) if self._loss is not None else None,
            "non_finite_grads": list(self._bad_grads), "sample_indices": indices,
            "offending": offending, "error": f"{type(error).__name__}: {error}" if error else None,
            "traceback": user_traceback(error), "config": untracked(run.config),
            "settings": run.settings.model_dump(mode="json"), "rank": self._rank.rank,
            "local_shards": self._sharded,
            "model_devices": sorted({str(p.device) for _, p in self._params}),
            "git": git_state(), **environment()}

    def _announce(self, run: RunContext, info: dict[str, Any], written: Any) -> None:
        where = _relative(written.path)
        samples = [o["sample_index"] for o in info["offending"]]
        rows = [o["row"] for o in info["offending"]]
        found = ""
        if rows:
            which = (f"sample {', '.join(map(str, samples))} of the dataset"
                     if None not in samples else f"row {', '.join(map(str, rows))} of the batch")
            found = f"; {which} holds NaN/inf"
        left = (f"; left out: {', '.join(p['part'] for p in written.left_out)} (over max_bytes)"
                if written.left_out else "")
        text = (f"{(info['message'] or info['reason']).rstrip('.')} at step {info['step']} (epoch "
                f"{info['epoch'] + 1}, batch {info['batch_in_epoch']}){found}; bundle {where} "
                f"({format_size(written.num_bytes)}){left}")
        run.record_event(EventKind.CAPTURE, "written", text, step=info["step"], path=written.path,
                         bytes=written.num_bytes, reason=info["reason"],
                         sample_indices=samples, left_out=written.left_out)
        command = (shlex.join(["python", *sys.argv]) if sys.argv and sys.argv[0]
                   else "python train.py")
        self._say(run, f"capture: {text}\n  reproduce it: prudent replay {where} -- {command}")

    def _say(self, run: RunContext, text: str) -> None:
        if self.quiet:
            return
        print(f"prudent | {run.id} | {text}", file=self.stream or sys.stderr, flush=True)


def _local_shards(state: Any) -> Any:
    """A state with each DTensor (FSDP2's parameters and optimizer state) as this rank's
    shard: a plain tensor that ``torch.load(weights_only=True)`` reads (a DTensor needs its
    mesh), taken without a collective; the bundle's name carries the rank."""
    if isinstance(state, dict):
        return {k: _local_shards(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(_local_shards(v) for v in state)
    return local_shard(state)


def _step_rng() -> tuple[Any, Any]:
    """The generators a step's own computation draws from (dropout and the like): torch's CPU
    and CUDA ones. Python's and NumPy's are left out: reading NumPy's costs ~0.2 ms a step, and
    a loop draws from them in the data loader, before the batch arrives, not in the step.

    Taken on every batch, so as cheaply as it can be: a clone of the CPU generator (~2 us less
    than ``get_rng_state()``'s new tensor), turned into a state tensor only for a bundle."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return _DEFAULT_GENERATOR.clone_state(), cuda  # is_available() costs ~10 us on a CPU build


def _drew(rng: tuple[Any, Any]) -> bool:
    """True when the generators moved since ``rng`` was taken (the step drew numbers)."""
    cpu, cuda = rng
    if not torch.equal(cpu.get_state(), _DEFAULT_GENERATOR.get_state()):
        return True
    now = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    if (cuda is None) != (now is None):
        return True
    return cuda is not None and not all(torch.equal(a, b) for a, b in zip(cuda, now))


def _rng_dict(rng: tuple[Any, Any]) -> dict[str, Any]:
    """A step's generators as :func:`prudent.kernel.rng.restore_rng` takes them."""
    cpu, cuda = rng
    state: dict[str, Any] = {"torch": cpu.get_state()}
    if cuda is not None:
        state["cuda"] = cuda
    return state


def _scalar(value: Any) -> float | str:
    """A loss as a number, or 'nan' / 'inf' (JSON has neither)."""
    try:
        number = (float(value.detach().float().mean()) if isinstance(value, torch.Tensor)
                  else float(value))
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else str(number)


def _relative(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path
