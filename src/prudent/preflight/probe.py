"""PreflightProbe: the component that watches a smoke run from inside the user's process.

It is plugged in only in smoke mode (set by ``prudent preflight`` in the launch spec) and
steers the loop through ``run.wrap_batches``: in ``smoke`` mode a few batches per epoch (in the
first epoch the rest of the data is scanned for non-finite values and its last batch is
trained on too, so a smaller last batch is exercised); in ``overfit`` mode the first batch again
and again. A loop without ``run.batches`` (``run.steps``, batches drawn with ``torch.randint``)
is shortened by ``run.step_limit``; in ``overfit`` mode its generators are rewound after every
step instead (``overfit.FirstStepReplay``), so it draws its first batches again. Per step it
records the loss, the step time, the batch's structure and the peak memory; it notes which
parameters ever got a gradient and what the model was fed in training and in evaluation. At
the end it writes all of it as JSON for the preflight runner to judge.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prudent.kernel.events import Component
from prudent.kernel.run import SMOKE_MAX_EPOCHS
from prudent.kernel.stop import StopKind
from prudent.launch.spec import LaunchSpec, PreflightSpec
from prudent.preflight import structure
from prudent.preflight.overfit import FirstStepReplay

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["OVERFIT_FACTOR", "PreflightProbe", "ProbeSettings"]

_T = TypeVar("_T")
_MAX_SIGNATURES = 8
OVERFIT_FACTOR = 10.0  # the loss on one repeated batch must fall at least this much
_MIN_OVERFIT_STEPS = 10
_FINGERPRINTED_STEPS = 64  # steps whose training inputs are hashed (overfit, resume compare them)


@dataclass(frozen=True)
class ProbeSettings:
    """What ``prudent preflight`` asks of one smoke process (its launch spec's preflight)."""

    mode: str = "smoke"  # smoke: a few batches per epoch; overfit: the first batch repeated
    steps: int = 8  # batches trained per epoch in smoke mode
    stop_at: int | None = None  # request a 'preempted' stop at this step (the resume check)
    out: str | None = None  # where the JSON goes (default <run folder>/preflight-<mode>.json)
    overfit_steps: int = 300  # at most; the run stops as soon as the loss fell OVERFIT_FACTOR x
    overfit_s: float = 30.0  # or once this long has passed since the first step
    scan_s: float = 20.0  # how long the first epoch's data scan may take

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProbeSettings:
        asked = LaunchSpec.from_env(environ).preflight or PreflightSpec()
        return cls(mode=asked.mode or cls.mode, steps=max(1, _given(asked.steps, cls.steps)),
                   stop_at=asked.stop_at, out=asked.out,
                   overfit_steps=max(2, _given(asked.overfit_steps, cls.overfit_steps)),
                   scan_s=_given(asked.scan_s, cls.scan_s))


class PreflightProbe(Component):
    name = "preflight"

    def __init__(self, settings: ProbeSettings | None = None) -> None:
        self.settings = settings or ProbeSettings()
        self.record: dict[str, Any] = {
            "mode": self.settings.mode, "status": "running", "stop_reason": None,
            "pid": os.getpid(), "steps": [], "epochs": [], "batches": [], "pending_batch": None,
            "scan": {"batches": 0, "complete": False, "seconds": 0.0, "nonfinite": []},
            "model_inputs": {}, "gradients": {}, "memory": {}, "exception": None}
        self._params: dict[str, Any] = {}  # name -> parameter, of every attached module
        self._optimizers: list[Any] = []
        self._got_grad: set[str] = set()
        self._stepped: set[str] = set()  # parameters whose optimizer stepped since their last grad
        self._stale: set[str] = set()  # got a new gradient on top of one an optimizer already used
        self._hooks: list[Any] = []
        self._loss: float | None = None
        self._batch_started: float | None = None
        self._last_step_end: float | None = None
        self._peak_rss = 0
        self._out: Path | None = None
        self._yielding_last = False  # the next batch is the first epoch's last (after the scan)
        self._batches_loaded = False  # the loop goes through run.batches (smoke mode shortens it)
        self._first_step_at: float | None = None
        self._inputs: Any = None  # this step's training inputs, hashed (hashlib.blake2b)

    @classmethod
    def build(cls, environ: Mapping[str, str] | None = None) -> PreflightProbe | None:
        """A probe when the process runs in smoke mode, else None."""
        if not LaunchSpec.from_env(environ).smoke:
            return None
        return cls(ProbeSettings.from_env(environ))

    # events -------------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        out = self.settings.out or str(run.run_dir / f"preflight-{self.settings.mode}.json")
        self._out = Path(out)
        self.record.update(run_id=run.id, started_at=time.time())
        run.wrap_batches(lambda it: self._overfit(run, it) if self.settings.mode == "overfit"
                         else self._smoke(run, it))
        if self.settings.mode == "smoke":  # an iteration loop (run.steps): as many steps as
            run.step_limit = SMOKE_MAX_EPOCHS * self.settings.steps  # two short epochs
        else:  # a loop that draws its own batches repeats them by rewinding the generators
            run.add_component(FirstStepReplay(self.record))
        self._write()  # the runner learns that the script called prudent.init()

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        import torch

        for key, obj in objects.items():
            if isinstance(obj, torch.nn.Module):
                self._watch_module(key, obj)
            elif isinstance(obj, torch.optim.Optimizer):
                stepped = _stepped_optimizer(obj)
                self._optimizers.append(stepped)
                self._hooks.append(stepped.register_step_post_hook(self._optimizer_stepped))

    def on_batch_loaded(self, run: RunContext, batch: Any, wait_s: float) -> None:
        self._batch_started = time.perf_counter() - wait_s
        self._batches_loaded = True
        leaves = structure.signature(batch)
        state = run.state
        self.record["pending_batch"] = {"step": state.step + 1, "epoch": state.epoch,
                                        "index": state.batches_in_epoch - 1, "leaves": leaves,
                                        "last_of_epoch": self._yielding_last}
        self._yielding_last = False
        for bad in structure.nonfinite_samples(batch):
            self._nonfinite(state.epoch, state.batches_in_epoch - 1, bad, trained=True)

    def on_after_backward(self, run: RunContext, loss: Any) -> None:
        self._loss = _to_float(loss)

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        now = time.perf_counter()
        loss = self._loss if self._loss is not None else _to_float(metrics.get("loss"))
        self._loss = None
        self._record_step(run, loss, now)
        self._last_step_end = now
        self._sample_memory()
        if self.settings.stop_at is not None and run.state.step == self.settings.stop_at:
            run.request_stop(StopKind.PREEMPTED, f"preflight: a simulated preemption at step "
                             f"{run.state.step}, to check that the run resumes exactly")
        if self.settings.mode == "overfit" and self._overfit_done(run.state.step, loss):
            run.request_stop(StopKind.PREFLIGHT, "preflight: the overfit-one-batch check is done")
        elif self._counts_for_itself(run):
            run.request_stop(StopKind.PREFLIGHT, f"preflight: smoke mode ended the loop after "
                             f"{run.state.step} steps (it counts its own iterations: neither "
                             "run.steps(n) nor run.batches(loader) can end it)")

    def _counts_for_itself(self, run: RunContext) -> bool:
        """A smoke run of a loop that smoke mode cannot shorten (``for it in range(n)`` around
        ``run.step()``, no ``run.batches``) has had its short run's steps: only a stop ends it
        before the timeout (it would train in full meanwhile)."""
        state, limit = run.state, run.step_limit
        return (self.settings.mode == "smoke" and limit is not None and state.step >= limit
                and state.num_steps is None and not self._batches_loaded)

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        self.record["num_logs"] = self.record.get("num_logs", 0) + 1

    def on_epoch_end(self, run: RunContext, epoch: int) -> None:
        tail = time.perf_counter() - self._last_step_end if self._last_step_end else None
        self.record["epochs"].append({"epoch": epoch, "step": run.state.step, "tail_s": tail})
        self._sample_memory()

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        for hook in self._hooks:
            hook.remove()
        self._sample_memory()
        state = run.state
        self.record.update(
            status=status, stop_reason=str(stop_reason) if stop_reason else None, ended_at=time.time(),
            num_epochs=state.num_epochs, batches_per_epoch=state.batches_per_epoch,
            num_steps=state.num_steps, step_limit=run.step_limit,
            final_step=state.step, device=str(run.device),
            exception=_current_exception(), gradients=self._gradient_report(),
            step_s=_median([s["time_s"] for s in self.record["steps"][1:] if s["time_s"]]))
        self._write()

    # the loop, steered ----------------------------------------------------------------------
    def _smoke(self, run: RunContext, iterator: Iterator[Any]) -> Iterator[Any]:
        state = run.state
        if state.batches_in_epoch and "resumed_at" not in self.record:
            self.record["resumed_at"] = {"step": state.step, "epoch": state.epoch,
                                         "batches_in_epoch": state.batches_in_epoch}
        if state.epoch > 0 or state.batches_in_epoch:
            yield from islice(iterator, max(0, self.settings.steps - state.batches_in_epoch))
            return
        yield from islice(iterator, self.settings.steps - 1)
        last = self._scan(iterator, state.epoch, self.settings.steps - 1)
        if last is not None:
            self._yielding_last = True
            yield last

    def _scan(self, iterator: Iterator[Any], epoch: int, start: int) -> Any:
        """Read the rest of the first epoch: data problems anywhere, and its last batch."""
        started = time.perf_counter()
        scan, last = self.record["scan"], None
        for index, batch in enumerate(iterator, start):
            if last is not None:
                self._scanned(last, epoch, index - 1)
            last = batch
            if time.perf_counter() - started > self.settings.scan_s:
                scan["seconds"] = round(time.perf_counter() - started, 3)
                return None  # incomplete: the last batch was not reached
        scan.update(complete=True, seconds=round(time.perf_counter() - started, 3))
        return last

    def _scanned(self, batch: Any, epoch: int, index: int) -> None:
        self.record["scan"]["batches"] += 1
        self._note_structure(structure.signature(batch), None, epoch, index)
        for bad in structure.nonfinite_samples(batch):
            self._nonfinite(epoch, index, bad, trained=False)

    def _overfit_done(self, step: int, loss: float | None) -> bool:
        """Enough steps, enough time, or the loss already fell by OVERFIT_FACTOR."""
        first = self.record["steps"][0]["loss"]
        if self._first_step_at is None:
            self._first_step_at = time.perf_counter()
        if step >= self.settings.overfit_steps or \
                time.perf_counter() - self._first_step_at > self.settings.overfit_s:
            return True
        return (step >= _MIN_OVERFIT_STEPS and first is not None and loss is not None
                and loss <= first / OVERFIT_FACTOR)

    def _overfit(self, run: RunContext, iterator: Iterator[Any]) -> Iterator[Any]:
        self.record["loader_repeated"] = True
        first = next(iterator, None)
        if first is None:
            return
        while True:  # the probe stops the run after overfit_steps
            yield first

    # recording ----------------------------------------------------------------------------
    def _record_step(self, run: RunContext, loss: float | None, now: float) -> None:
        state = run.state
        # without run.batches a step is timed from the end of the one before: the whole iteration
        started = self._batch_started or self._last_step_end
        self._batch_started = None
        self.record["steps"].append({
            "step": state.step, "epoch": state.epoch, "index": state.batches_in_epoch - 1,
            "loss": loss, "time_s": round(now - started, 6) if started else None,
            "rng": _rng_fingerprint(),
            "inputs": self._inputs.hexdigest() if self._inputs is not None else None})
        self._inputs = None
        pending = self.record["pending_batch"]
        if pending is not None:
            self._note_structure(pending["leaves"], state.step, state.epoch, pending["index"],
                                 pending["last_of_epoch"])
            self.record["pending_batch"] = None

    def _note_structure(self, leaves: list[structure.Leaf], step: int | None, epoch: int,
                        index: int, last_of_epoch: bool = False) -> None:
        """Keep the first signature, and each one that differs from every one kept."""
        seen = self.record["batches"]
        for entry in seen:
            if entry["leaves"] == leaves:
                entry["count"] += 1
                return
        if len(seen) < _MAX_SIGNATURES:
            seen.append({"leaves": leaves, "count": 1, "first_step": step, "epoch": epoch,
                         "index": index, "trained": step is not None,
                         "last_of_epoch": last_of_epoch})

    def _nonfinite(self, epoch: int, index: int, bad: dict[str, Any], trained: bool) -> None:
        found = self.record["scan"]["nonfinite"]
        if len(found) < 20:
            found.append({"epoch": epoch, "index": index, "trained": trained, **bad})

    def _sample_memory(self) -> None:
        import psutil

        self._peak_rss = max(self._peak_rss, psutil.Process().memory_info().rss)
        memory = {"peak_rss_bytes": self._peak_rss}
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            memory["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        self.record["memory"] = memory

    def _watch_module(self, key: str, module: Any) -> None:
        prefix = f"{key}." if self._params else ""
        for name, param in module.named_parameters():
            self._params[prefix + name] = param
            if param.requires_grad:
                self._hooks.append(param.register_post_accumulate_grad_hook(
                    self._grad_seen(prefix + name)))
                self._hooks.append(param.register_hook(self._grad_arriving(prefix + name, param)))
        self._hooks.append(module.register_forward_pre_hook(self._input_seen(key),
                                                            with_kwargs=True))

    def _grad_seen(self, name: str) -> Any:
        def hook(param: Any) -> None:
            if name not in self._got_grad and param.grad is not None and bool(param.grad.any()):
                self._got_grad.add(name)
        return hook

    def _grad_arriving(self, name: str, param: Any) -> Any:
        """Before a new gradient is added to ``.grad``: is the one there already used up?"""
        def hook(grad: Any) -> None:
            if name in self._stepped:
                self._stepped.discard(name)
                if param.grad is not None and bool(param.grad.any()):
                    self._stale.add(name)
        return hook

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self._stepped.update(n for n, p in self._params.items() if id(p) in ids)

    def _input_seen(self, key: str) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            mode = "train" if module.training else "eval"
            seen = self.record["model_inputs"].setdefault(key, {}).setdefault(mode, [])
            leaves = structure.signature({"args": args, "kwargs": kwargs}, "input")
            if len(seen) < 3 and all(structure.compare(s, leaves) for s in seen):
                seen.append(leaves)
            if module.training and len(self.record["steps"]) < _FINGERPRINTED_STEPS:
                self._fingerprint((args, kwargs))
        return hook

    def _fingerprint(self, inputs: Any) -> None:
        """Fold one training forward's inputs into the step's hash (every micro-step's)."""
        import hashlib

        if self._inputs is None:
            self._inputs = hashlib.blake2b(digest_size=8)
        structure.fingerprint(inputs, self._inputs)

    def _gradient_report(self) -> dict[str, Any]:
        trainable = [n for n, p in self._params.items() if p.requires_grad]
        in_optimizer = {id(p) for opt in self._optimizers for g in opt.param_groups
                        for p in g["params"]}
        return {
            "num_params": len(self._params), "num_trainable": len(trainable),
            "never": [n for n in trainable if n not in self._got_grad],
            "frozen": [n for n, p in self._params.items() if not p.requires_grad],
            "not_in_optimizer": [n for n in trainable if self._optimizers
                                 and id(self._params[n]) not in in_optimizer],
            "stale": sorted(self._stale), "watched": bool(self._params)}

    def _write(self) -> None:
        assert self._out is not None
        self._out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, default=str))
        os.replace(tmp, self._out)


def _stepped_optimizer(optimizer: Any) -> Any:
    """The optimizer whose ``step()`` runs: the one a wrapper holds in ``.optimizer``.
    accelerate's ``AcceleratedOptimizer`` subclasses ``Optimizer`` without its ``__init__`` (so
    it has no step hooks of its own) and steps the optimizer it wraps."""
    import torch

    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def _to_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        if hasattr(value, "detach"):
            return float(value.detach().float().mean())
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _rng_fingerprint() -> dict[str, str]:
    """Each generator prudent checkpoints (python, numpy, torch, cuda) as a short hash, for the
    resume check to compare across processes."""
    import hashlib

    from prudent.kernel.rng import capture_rng

    hashes = {}
    for name, state in capture_rng().items():
        digest = hashlib.blake2b(digest_size=8)
        structure.fingerprint(state, digest)
        hashes[name] = digest.hexdigest()
    return hashes


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _current_exception() -> dict[str, Any] | None:
    """The exception the run is ending with (inside ``with run:`` or at interpreter exit)."""
    from prudent.kernel.context import uncaught_exception

    exc = sys.exc_info()[1] or uncaught_exception()
    if exc is None or type(exc).__name__ in ("StopRun", "SystemExit", "KeyboardInterrupt"):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    return {"type": type(exc).__name__, "message": str(exc),
            "frames": [{"file": f.filename, "line": f.lineno, "function": f.name,
                        "code": f.line} for f in frames]}


def _given(value: _T | None, default: _T) -> _T:
    return default if value is None else value
