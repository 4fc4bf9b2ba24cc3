"""StepStats: the training statistics, gathered on the device and read a window at a time.

Per step it keeps references only: the loss (detached) and the gradient norms of every
parameter from one ``torch._foreach_norm`` call (one fused kernel or two on a GPU, no
synchronisation); the global norm is finished on the host. Every ``sample_every_steps`` it
adds per-layer gradient norms, the update-to-weight ratio (from a strided sample of each
weight, so the copy stays small on a large model), activation statistics and memory.
:meth:`take_window` moves all of it to the host with one or two copies per device and hands
the rules plain floats.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prudent.monitor.activations import ActivationProbe
from prudent.monitor.base import ActivationSample, LayerSample, MemorySample, Window
from prudent.monitor.settings import MonitorSettings

__all__ = ["StepStats"]

_SAMPLED_ELEMENTS = 4096  # per weight tensor, for the update ratio
_MAX_NORM_STRIDE = 16  # auto never measures the gradient norm less often than this
_BURST_JUMP = 3.0  # a norm this many times the previous one starts measuring every step


@dataclass
class _Layers:
    """One layer sample while its numbers are still on the device."""

    step: int
    names: list[str]
    numels: list[int]
    matrix: list[bool]
    grad_norms: Any = None
    views: list[Any] | None = None
    before: list[Any] | None = None
    update_norms: Any = None
    weight_norms: Any = None


class StepStats:
    def __init__(self, settings: MonitorSettings | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        settings = settings or MonitorSettings()
        self.min_check_every = settings.check_every_steps
        self.max_check_every = settings.max_check_every_steps
        self.check_every = settings.check_every_steps  # stretched when checks are dear
        self.sample_every = settings.sample_every_steps
        self.auto_stride = settings.grad_norm_every_steps == "auto"
        self.norm_every = 1 if self.auto_stride else int(settings.grad_norm_every_steps)
        self.budget = settings.overhead_budget
        self.clock = clock
        self.activations = ActivationProbe()
        self.params: list[Any] = []
        self.names: list[str] = []
        self.optimizers: list[Any] = []
        self.scaler: Any = None
        self.peak_lr: float | None = None
        self._clear()
        self._norm_costs: list[float] = []
        self._window_start = clock()
        self._burst = 0
        self._last_norm = 0.0
        self._step_s: float | None = None  # the last window's mean step time

    def _clear(self) -> None:
        self._steps: list[int] = []
        self._loss: list[Any] = []
        # step -> global norm (read at once on the CPU), or (norm of each gradient, AMP scale)
        self._norms: dict[int, float | tuple[Any, Any]] = {}
        self._layers: list[_Layers] = []
        self._memory: list[MemorySample] = []

    # what the loop has ---------------------------------------------------------------------
    def attach(self, objects: dict[str, Any]) -> None:
        """Find models, optimizers and an enabled GradScaler among the attached objects."""
        import torch

        modules = [(k, o) for k, o in objects.items() if isinstance(o, torch.nn.Module)]
        self.optimizers += [o for o in objects.values() if isinstance(o, torch.optim.Optimizer)]
        for obj in objects.values():
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled():
                self.scaler = obj
        self._add_params(modules)
        self.activations.find(modules)

    def _add_params(self, modules: list[tuple[str, Any]]) -> None:
        seen = {id(p) for p in self.params}
        named = [(f"{k}.{n}" if len(modules) > 1 else n, p) for k, m in modules
                 for n, p in m.named_parameters()]
        named += [(f"param{i}", p) for i, o in enumerate(self.optimizers)
                  for g in o.param_groups for p in g["params"]]
        for name, param in named:
            if param.requires_grad and id(param) not in seen:
                seen.add(id(param))
                self.params.append(param)
                self.names.append(name)

    # the loop's events ---------------------------------------------------------------------
    def after_backward(self, step: int) -> None:
        if step % self.sample_every == 0:
            self._sample_layers(step)
        elif self._burst > 0 or step % self.norm_every == 0:
            self._burst = max(0, self._burst - 1)
            started = self.clock()
            norms, scale = self._tensor_norms()
            if norms is not None:
                # on the CPU a tensor's value is plain memory: reading it now costs no wait
                if norms.is_cpu:
                    self._norms[step] = self._watch(_global_norm(norms, scale))
                else:
                    self._norms[step] = (norms, scale)
            self._norm_costs.append(self.clock() - started)

    def _watch(self, norm: float) -> float:
        """A norm far above the previous one (or not finite): measure every step for a while,
        so a sparse stride does not miss an explosion's few steps before the overflow."""
        if not math.isfinite(norm) or (self._last_norm and norm > _BURST_JUMP * self._last_norm):
            self._burst = 2 * self.norm_every
        self._last_norm = norm
        return norm

    def step_end(self, step: int, loss: Any) -> bool:
        """Record the step; True when a window is due."""
        self._steps.append(step)
        if hasattr(loss, "is_cpu"):  # a tensor: read now on the CPU, later from a device
            loss = loss.item() if loss.is_cpu else loss.detach()
        self._loss.append(loss)
        if isinstance(loss, float) and not math.isfinite(loss):
            return True  # a value already on the host: judge it now, not a window later
        if step % self.sample_every == 0:
            self._finish_layers(step)
            self._memory.append(_memory_sample(step))
        if self.activations.armed:
            self.activations.step_done()
        elif (step + 1) % self.sample_every == 0:
            self.activations.arm(step + 1)  # hooks for the next step's forward pass only
        return len(self._steps) >= self.check_every

    # device-side statistics ----------------------------------------------------------------
    def _tensor_norms(self) -> tuple[Any, Any]:
        """The per-step path: every gradient's norm from one fused call, and the AMP scale."""
        import torch

        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return None, None
        try:
            norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
        except RuntimeError:  # sparse gradients, or parameters on several devices
            device = grads[0].device
            norms = torch.stack([torch.linalg.vector_norm(
                g.coalesce().values() if g.is_sparse else g, dtype=torch.float32).to(device)
                for g in grads])
        scale = getattr(self.scaler, "_scale", None) if self.scaler is not None else None
        return norms, (scale.clone() if scale is not None else None)  # update() changes it

    def _sample_layers(self, step: int) -> None:

        index = [i for i, p in enumerate(self.params) if p.grad is not None]
        norms, scale = self._tensor_norms()
        if norms is None:
            return
        self._norms[step] = (norms, scale)
        params = [self.params[i] for i in index]
        views = [_sampled_view(p) for p in params]
        self._layers.append(_Layers(
            step, [self.names[i] for i in index], [p.numel() for p in params],
            [p.dim() >= 2 for p in params], norms if scale is None else norms / scale,
            views, [v.clone() for v in views]))

    def _finish_layers(self, step: int) -> None:
        import torch

        if not self._layers or self._layers[-1].step != step or self._layers[-1].views is None:
            return
        sample = self._layers[-1]
        delta = torch._foreach_sub(sample.views, sample.before)  # type: ignore[arg-type]
        sample.update_norms = _stacked_norms(delta, sample.grad_norms.device)
        sample.weight_norms = _stacked_norms(sample.before, sample.grad_norms.device)
        sample.views = sample.before = None

    # to the host ---------------------------------------------------------------------------
    def take_window(self) -> Window:
        """Everything since the last window, as host values (one or two copies per device)."""
        import torch

        steps, losses, norms, layers = self._steps, self._loss, self._norms, self._layers
        activations = self.activations.take()
        tensors = [v for v in losses if isinstance(v, torch.Tensor)]
        on_device = [(step, n) for step, n in norms.items() if isinstance(n, tuple)]
        for _, (per_tensor, scale) in on_device:
            tensors.append(per_tensor)
            if scale is not None:
                tensors.append(scale)
        for sample in layers:
            tensors += [t for t in (sample.grad_norms, sample.update_norms, sample.weight_norms)
                        if t is not None]
        for _, fractions, _ in activations:
            tensors += fractions.values()
        host = iter(_to_host(tensors))
        loss = [_single(next(host)) if isinstance(v, torch.Tensor) else _number(v) for v in losses]
        window = Window(steps=steps, loss=loss, memory=self._memory, amp=self.scaler is not None)
        if norms:
            for step, (_, scale) in on_device:
                norms[step] = _global_norm(next(host), next(host)[0] if scale is not None else None)
            window.grad_norm = [norms.get(step) for step in steps]  # type: ignore[misc]
        else:
            window.grad_norm = [None] * len(steps)
        window.layers = [_layer_sample(sample, host) for sample in layers]
        window.activations = [ActivationSample(step, {k: next(host)[0] for k in fractions}, kinds)
                              for step, fractions, kinds in activations]
        self._learning_rate(window)
        self._adapt_stride(len(steps))
        self._clear()
        return window

    def _learning_rate(self, window: Window) -> None:
        if not self.optimizers or not self.optimizers[0].param_groups:
            return
        window.lr = float(self.optimizers[0].param_groups[0]["lr"])
        self.peak_lr = max(self.peak_lr or 0.0, window.lr)
        window.peak_lr = self.peak_lr

    def check_took(self, cost_s: float) -> None:
        """Stretch the check interval so that checks take at most ``overhead_budget`` of the
        step time (a tiny CPU model's step is a few ms, a rule check a hundred us), never
        beyond ``max_check_every_steps``. On a GPU, where steps are long, checks stay every
        ``check_every_steps``; a non-finite loss read on the host is judged at once whatever
        the interval."""
        if not self._step_s:
            return
        wanted = math.ceil(cost_s / (self.budget * self._step_s) - 1e-9)
        self.check_every = max(self.min_check_every, min(self.max_check_every, wanted))

    def _adapt_stride(self, num_steps: int) -> None:
        """Auto: measure gradient norms as often as ``overhead_budget`` of the step time allows."""
        now = self.clock()
        elapsed, self._window_start = now - self._window_start, now
        costs, self._norm_costs = self._norm_costs, []
        if num_steps:
            self._step_s = elapsed / num_steps
        if not self.auto_stride or not costs or not num_steps:
            return
        cost = statistics.median(costs)  # one preempted measurement does not count
        step_s = elapsed / num_steps
        wanted = math.ceil(cost / (self.budget * step_s)) if step_s > 0 else 1
        self.norm_every = max(1, min(_MAX_NORM_STRIDE, wanted))


def _stacked_norms(tensors: list[Any], device: Any) -> Any:
    import torch

    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    try:
        return torch.stack(norms)
    except RuntimeError:  # parameters on several devices
        return torch.stack([n.to(device) for n in norms])


def _sampled_view(param: Any) -> Any:
    """A live view of at most ~4096 evenly spaced elements (the whole tensor if not contiguous)."""
    flat = param.detach()
    if not flat.is_contiguous():
        return flat
    flat = flat.view(-1)
    return flat[:: max(1, flat.numel() // _SAMPLED_ELEMENTS)]


def _to_host(tensors: list[Any]) -> list[list[float]]:
    """Each tensor's values as floats: one stack of the scalars and one concatenation of the
    rest, per device (usually there is one device, and no grouping to do)."""
    out: list[list[float]] = [[] for _ in tensors]
    scalars = [i for i, t in enumerate(tensors) if t.dim() == 0]
    vectors = [i for i, t in enumerate(tensors) if t.dim() != 0]
    for group in (scalars, vectors):
        if group:
            try:
                _copy_group(tensors, group, out)
            except RuntimeError:  # tensors on several devices
                by_device: dict[Any, list[int]] = {}
                for i in group:
                    by_device.setdefault(tensors[i].device, []).append(i)
                for indices in by_device.values():
                    _copy_group(tensors, indices, out)
    return out


def _copy_group(tensors: list[Any], indices: list[int], out: list[list[float]]) -> None:
    import torch

    if tensors[indices[0]].dim() == 0:
        for i, value in zip(indices, torch.stack([tensors[i] for i in indices]).float().tolist()):
            out[i] = [value]
        return
    parts = [tensors[i].reshape(-1) for i in indices]
    flat = torch.cat(parts).float().tolist()
    offset = 0
    for i, part in zip(indices, parts):
        out[i] = flat[offset:offset + part.numel()]
        offset += part.numel()


def _single(values: list[float]) -> float:
    return values[0] if len(values) == 1 else float("nan")  # a loss must be one number


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, float):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _global_norm(norms: Any, scale: Any) -> float:
    """The norm of all gradients from each one's norm (a tensor or floats), unscaled for AMP."""
    values = norms.tolist() if hasattr(norms, "tolist") else norms
    total = math.sqrt(math.fsum(norm * norm for norm in values))
    if scale is not None:
        total /= float(scale) or 1.0
    return total


def _layer_sample(sample: _Layers, host: Iterator[list[float]]) -> LayerSample:
    grad = next(host) if sample.grad_norms is not None else []
    rms = {name: norm / math.sqrt(max(1, numel)) for name, numel, matrix, norm
           in zip(sample.names, sample.numels, sample.matrix, grad) if matrix}
    if sample.update_norms is None:
        return LayerSample(sample.step, rms)
    update, weight = next(host), next(host)
    total_weight = math.sqrt(math.fsum(w * w for w in weight))
    ratio = math.sqrt(math.fsum(u * u for u in update)) / total_weight if total_weight > 0 else None
    per_layer = {name: u / w for name, u, w in zip(sample.names, update, weight) if w > 0}
    return LayerSample(sample.step, rms, ratio, per_layer)


@functools.lru_cache(maxsize=1)
def _this_process() -> Any:
    import psutil

    return psutil.Process()


def _memory_sample(step: int) -> MemorySample:
    import torch

    device = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = int(torch.cuda.memory_allocated())
    return MemorySample(step, int(_this_process().memory_info().rss), device)
