"""StepStats: the training statistics, gathered on the device and read a window at a time.

Per step it keeps references only: the loss (detached) and the gradient norms of every
parameter from one ``torch._foreach_norm`` call (one fused kernel or two on a GPU, no
synchronisation); the global norm is finished on the host. Every ``sample_every_steps`` it
adds per-layer gradient norms, the update-to-weight ratio (from a strided sample of each
weight, so the copy stays small on a large model), activation statistics and memory.
:meth:`take_window` moves all of it to the host with one or two copies per device and hands
the rules plain floats.

With sharded parameters (FSDP2's DTensors) the norms are taken on each rank's shard and made
global by one all_reduce on the measured steps (:mod:`prudent.monitor.shards`), which also
agrees on the steps that measure next: every rank measures and samples at the same steps,
whatever its own clock or loss said. The update ratio sums every rank's sampled elements.
What stays this rank's own: the loss, the activations (its own examples) and memory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prudent.monitor.activations import ActivationProbe
from prudent.monitor.base import ActivationSample, LayerSample, MemorySample, Window
from prudent.monitor.memory import memory_sample
from prudent.monitor.settings import MonitorSettings
from prudent.monitor.shards import ShardedNorms

__all__ = ["StepStats", "grid_after", "on_grid", "saved_loss"]

_SAMPLED_ELEMENTS = 4096  # per weight tensor, for the update ratio
_MAX_NORM_STRIDE = 32  # auto never measures the gradient norm less often than this
# ...nor more often than this when every step's loss is on the host (training on the CPU) and
# one norm costs more than _DEAR_NORM of a step: the loss is then the early warning (a jump
# measures the next norm at once, see look_closer), and a dear norm on one step in ten moves
# the median step (10% of the steps carry it)
_HOST_LOSS_NORM_STRIDE = 16
# ...and, then, as rarely as overhead_budget asks up to this: every such norm is a step above
# the median (30-40 us on a 26k-parameter MLP's 0.7 ms CPU step, cache-cold gradients)
_MAX_HOST_LOSS_NORM_STRIDE = 64
_DEAR_NORM = 0.01
_BURST_JUMP = 3.0  # a norm this many times the previous one starts measuring every step
# a burst ends once this many norms in a row are back below _BURST_JUMP x the norm before it
_BURST_CALM = 4
_LOSS_JUMP = 4.0  # a host loss this many times the last window's mean: measure the next norm
# the steps whose norm exploding_gradient's skip judges before the update, whatever the timing:
# every step at first, then every 2, 4, ... as the run goes on, every 32 from step 128 (the
# median it judges against fills in a few dozen steps, and costs a norm per 32 steps after)
_GRID_EVERY = 32


@dataclass
class _Layers:
    """One layer sample while its numbers are still on the device."""

    step: int
    names: list[str]
    numels: list[int]
    matrix: list[bool]
    grad_norms: Any = None
    params: list[Any] | None = None  # the parameters sampled (for a sharded sample's reduce)
    views: list[Any] | None = None
    before: list[Any] | None = None
    update_and_weight_norms: Any = None  # ||after - before|| of each tensor, then ||before||


@dataclass(frozen=True)
class _Layout:
    key: tuple[tuple[int, ...], tuple[int, ...]]  # which parameters, and where their data is
    names: list[str]
    numels: list[int]
    matrix: list[bool]
    views: list[Any]
    params: list[Any]


class StepStats:
    def __init__(self, settings: MonitorSettings | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        settings = settings or MonitorSettings()
        self.min_check_every = settings.check_every_steps
        self.max_check_every = settings.max_check_every_steps
        self.check_every = settings.check_every_steps  # stretched when checks are dear
        self.sample_every = settings.sample_every_steps
        self._next_sample = self.sample_every
        self.memory_every = self.sample_every  # memory is cheap: sampled more often on short runs
        self._next_memory = self.memory_every
        self.memory_every_s = settings.memory_every_s
        self._last_memory = -math.inf  # clock() of the newest memory sample
        self.auto_stride = settings.grad_norm_every_steps == "auto"
        self.norm_every = 1 if self.auto_stride else int(settings.grad_norm_every_steps)
        self._next_norm = self.norm_every
        # the hot path compares one number per event: the first step with work to do
        self.backward_due = min(self._next_sample, self._next_norm)
        self._step_end_due = self._next_sample - 1  # arm the activation hooks
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
        self._burst_base = 0.0  # the norm before the burst's jump
        self._calm = 0  # norms in a row of the burst back below its jump
        self._jump_from: float | None = None  # a jump's reference, until the next norm confirms it
        self._last_norm = 0.0
        self._norm_mean = 0.0  # moving mean of the last ~4 finite norms
        self._loss_jump_at = math.inf  # set from each window's losses
        self.judge_grid = False  # exploding_gradient's skip: measure on every grid step too
        self._step_s: float | None = None  # the last window's mean step time
        self.last_step_s: float | None = None
        self._layout_cache: _Layout | None = None
        self._shards: ShardedNorms | None = None  # DTensor parameters: norms made global
        self._look = False  # sharded: a loss jump here, for the next agreement to carry
        self._open_sample: _Layers | None = None  # a layer sample its step's end finishes

    def _clear(self) -> None:
        self._steps: list[int] = []
        self._loss: list[Any] = []  # floats or None; device tensors when _device_losses
        self._device_losses = False
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
        self._shards = ShardedNorms.find(self.params)

    # the loop's events ---------------------------------------------------------------------
    def after_backward(self, step: int) -> None:
        """Between backward and the optimizer step: the gradient norms, when due."""
        if step < self.backward_due:
            return
        self._burst = max(0, self._burst - 1)
        if self._shards is not None:
            self._agreed_norms(step, self._shards)
            return
        if step >= self._next_sample:
            self._sample_layers(step)  # the norms too
        else:
            started = self.clock()
            norms, scale = self._tensor_norms()
            if norms:
                # on the CPU a tensor's value is plain memory: reading it now costs no wait
                if norms[0].is_cpu:  # one read for all of them
                    self._norms[step] = self._watch(_global_norm(_stack(norms).tolist(), scale))
                else:
                    self._norms[step] = (_stack(norms), scale)
            self._norm_costs.append(self.clock() - started)
        follow = self._burst or self._jump_from is not None
        if follow or not self.judge_grid:
            self._next_norm = step + (1 if follow else self.norm_every)
        else:  # the stride's multiples, a power of two: the grid's steps are among them
            every = 1 << (self.norm_every - 1).bit_length()
            self._next_norm = (step // every + 1) * every
        if self.judge_grid:
            self._next_norm = min(self._next_norm, grid_after(step))
        self.backward_due = min(self._next_sample, self._next_norm)

    def measure_grid(self, on: bool = True) -> None:
        """Measure the norm on every grid step too (see :func:`on_grid`), from the next step
        on: exploding_gradient's skip judges them before their update."""
        self.judge_grid = on
        if on:
            self._next_norm = min(self._next_norm, 1)
            self._reschedule()

    def measured(self, step: int) -> bool:
        """The gradient norm of ``step`` was measured (and not yet taken in a window)."""
        return step in self._norms

    def host_norm(self, step: int) -> float | None:
        """The global gradient norm measured at ``step``, as a number (None if not measured,
        or measured on a device: reading it there would make the step wait)."""
        norm = self._norms.get(step)
        if norm is None or norm.__class__ is float:
            return norm  # type: ignore[return-value]
        per_tensor, scale = norm  # type: ignore[misc]
        if not per_tensor.is_cpu or (scale is not None and not scale.is_cpu):
            return None
        value = self._norms[step] = _global_norm(per_tensor.tolist(), scale)
        return value

    def _reschedule(self) -> None:
        """The next step whose backward needs us. Sharded, only an agreement moves it (see
        :meth:`_agreed_norms`): what this rank alone decides waits for the next one."""
        if self._shards is None:
            self.backward_due = min(self._next_sample, self._next_norm)

    def _agreed_norms(self, step: int, shards: ShardedNorms) -> None:
        """after_backward with sharded parameters: the global norms and the steps that measure
        next, agreed in one all_reduce (see :mod:`prudent.monitor.shards`). Read on the host at
        once: the next backward must know whether it measures (a wait for the device, on the
        measured steps only; on the CPU nothing to wait for)."""
        started = self.clock()
        sample_now = step >= self._next_sample  # the leader's counts
        gap = self.sample_every if sample_now else self._next_sample - step
        params = [p for p in self.params if p.grad is not None]
        local = shards.local_norms([p.grad for p in params], self.params[0].device)
        norms, (sample, stride, gap, look) = shards.reduce(
            params, local, plan=(sample_now, self.norm_every, gap), wishes=(self._look,))
        self._look = False
        scale = self._host_scale()
        if norms:
            self._norms[step] = self._watch(_global_norm(norms, scale))
        if sample and norms:
            self._open_layers(step, norms, scale)
        else:
            self._norm_costs.append(self.clock() - started)
        follow = self._burst or self._jump_from is not None or look > 0
        self._next_norm = step + (1 if follow else max(1, round(stride)))
        self.backward_due = min(self._next_norm, step + max(1, round(gap)))

    def _host_scale(self) -> float | None:
        scale = getattr(self.scaler, "_scale", None) if self.scaler is not None else None
        return None if scale is None else float(scale)

    def _watch(self, norm: float) -> float:
        """A norm far above the recent ones (or not finite): measure every step for a while,
        so a sparse stride does not miss an explosion's few steps before the overflow. Recent:
        the previous norm or the moving mean of the last ~4, whichever is larger (against the
        previous norm alone, one lucky small batch made the next ordinary one a jump: a burst
        every ~600 steps of a healthy run, 3% of its steps measured for nothing).

        A finite jump is confirmed first by the next step's norm, measured whatever the stride:
        the burst starts only if that one is still above the bar. Late in a healthy run the
        norm is small and noisy (0.003-0.03 on the digits MLP) and one batch in ~400 lands
        3x above the recent ones, then the next falls back: each such fluke cost a burst of
        32-46 measured steps (30% of a 2,000-step Lightning run's steps carried a norm; 8%
        now); now it costs one norm. An explosion keeps climbing and is followed one step
        later.

        A burst ends early once _BURST_CALM norms in a row are back below the bar its jump
        crossed (_BURST_JUMP x the norm before it): a healthy run's hard batch two steps
        running (the digits MLP's ~1.3 among norms of 0.01-0.04, a few times in 2,000 steps)
        cost 64 measured steps and a rule check every check_every_steps; an explosion stays
        above the bar and is followed to the burst's end."""
        reference = max(self._last_norm, self._norm_mean)
        confirming, self._jump_from = self._jump_from, None
        if not math.isfinite(norm) or (confirming is not None and norm > _BURST_JUMP * confirming):
            if not self._burst:
                self._burst_base = confirming if confirming is not None else reference
            self._burst, self._calm = 2 * min(self.norm_every, _MAX_NORM_STRIDE), 0
        else:
            if self._burst:
                self._calm = self._calm + 1 if norm <= _BURST_JUMP * self._burst_base else 0
                if self._calm >= _BURST_CALM:
                    self._burst = 0
            if confirming is None and reference and norm > _BURST_JUMP * reference:
                self._jump_from = reference  # (in a burst too: a confirmed jump makes it longer)
        if math.isfinite(norm):
            mean = self._norm_mean
            self._norm_mean = norm if not mean else mean + 0.25 * (norm - mean)
            self._last_norm = norm
        return norm

    def step_end(self, step: int, loss: Any) -> bool:
        """Record one step; True when a window is due."""
        return self.add_steps([step], [loss])

    def add_steps(self, steps: list[int], losses: list[Any], judged: bool = False) -> bool:
        """Record the steps since the last call with their losses (the kernel keeps them while
        the monitor sleeps, see :class:`~prudent.kernel.step_values.StepValues`); True when a window
        is due. ``judged``: the kernel's loss watch has already looked at each host loss (a
        NaN, a jump, see :attr:`loss_jump_at`), so they are only kept."""
        if not steps:
            return False
        self._steps += steps
        for loss in losses:
            if loss.__class__ is not float:  # most steps: the kernel has read the CPU loss already
                losses = [v if v.__class__ is float else self._kept_loss(v) for v in losses]
                break
        self._loss += losses
        due = False
        if not judged:
            jump_at = self._loss_jump_at
            for step, loss in zip(steps, losses):
                if loss.__class__ is float:
                    if loss - loss != 0.0:  # NaN or infinite
                        due = True  # a value already on the host: judged now, not a window later
                    elif loss > jump_at:
                        self.look_closer(step)
        step = steps[-1]
        if step >= self._step_end_due:
            self._sample_step_end(step)
        return due or len(self._steps) >= self.window_steps()

    def pending(self) -> tuple[list[int], list[float | None]]:
        """The steps recorded since the last window was taken, with their losses as numbers:
        what a checkpoint keeps, so that a resumed run's rules see the same steps."""
        return list(self._steps), [saved_loss(v) for v in self._loss]

    def restore_pending(self, steps: list[int], losses: list[float | None]) -> None:
        """Put back what :meth:`pending` returned (a resumed run, before its first step)."""
        self._steps, self._loss = list(steps) + self._steps, list(losses) + self._loss

    def window_steps(self) -> int:
        """Steps a window gathers: while a jump in the gradient norm is being followed, the
        rules look every check_every_steps however rare checks have become (an explosion
        takes a few dozen steps)."""
        return self.min_check_every if self._burst else self.check_every

    @property
    def loss_jump_at(self) -> float:
        """A host loss above this is looked at closer (see :meth:`look_closer`)."""
        return self._loss_jump_at

    @property
    def bursting(self) -> bool:
        """A jump in the gradient norm is being followed (a norm on every step)."""
        return self._burst > 0

    def next_due(self, step: int) -> int:
        """After ``step``, the next step whose end needs the monitor: a window due, or a layer
        or memory sample (or the activation hooks' arming)."""
        return min(step + max(1, self.window_steps() - len(self._steps)), self._step_end_due)

    def _kept_loss(self, loss: Any) -> Any:
        """A loss as the window keeps it: a float, or a detached device tensor read later."""
        if hasattr(loss, "is_cpu"):  # a tensor: read now on the CPU, later from a device
            if loss.is_cpu:
                return loss.item()
            self._device_losses = True
            return loss.detach()
        return None if loss is None else _number(loss)  # an int, a NumPy number

    def look_closer(self, step: int) -> None:
        """A loss far above the last window's mean: measure the next step's gradient norm
        whatever the stride (an explosion grows the loss 10x a step for a few dozen steps
        before it overflows; a sparse stride would see none of it). A jump in the norm then
        starts a burst (see :meth:`_watch`); a noisy batch costs one extra norm."""
        if self._shards is not None:
            self._look = True  # this rank's loss alone: carried by the next agreement
            return
        self._next_norm = min(self._next_norm, step + 1)
        self._reschedule()

    def _sample_step_end(self, step: int) -> None:
        """Finish a layer sample, and keep the activation hooks on for exactly the steps
        their sample needs."""
        if step >= self._next_sample:
            self._finish_layers(step)
            self._next_sample = step + self.sample_every
            self._reschedule()
        if step >= self._next_memory:
            self._sample_memory(step)
        if self.activations.armed:
            self.activations.step_done()
        elif step + 1 == self._next_sample:
            self.activations.arm(step + 1)  # hooks for the next step's forward pass only
        self._step_end_due = min(step + 1 if self.activations.armed else self._next_sample - 1,
                                 self._next_memory)

    def _sample_memory(self, step: int) -> None:
        self._memory.append(memory_sample(step))
        self._last_memory = self.clock()
        self._next_memory = step + self.memory_every

    def fit(self, planned_steps: int, sample_every: int | None = None,
            step: int | None = None) -> None:
        """Sample memory about every 1% of a run of ``planned_steps`` (at least every 5 steps
        apart, at most every ``sample_every_steps``), and layers every ``sample_every`` steps:
        each next sample comes that many steps after the previous one (the start of the run
        if none), never before the step after ``step`` (where the run is)."""
        done = self._steps_done() if step is None else step
        if sample_every is not None and sample_every != self.sample_every:
            last = self._next_sample - self.sample_every
            self.sample_every = sample_every
            self._next_sample = min(self._next_sample, max(done + 1, last + sample_every))
            self._reschedule()
        memory_every = max(5, min(self.sample_every, planned_steps // 100))
        last, self.memory_every = self._next_memory - self.memory_every, memory_every
        self._next_memory = min(self._next_memory, max(done + 1, last + memory_every))
        self._step_end_due = min(self._step_end_due, self._next_sample - 1, self._next_memory)

    def _steps_done(self) -> int:
        return self._steps[-1] if self._steps else self._next_memory - self.memory_every

    # device-side statistics ----------------------------------------------------------------
    def _tensor_norms(self) -> tuple[Any, Any]:
        """The per-step path: every gradient's norm (0-d tensors on the first gradient's
        device) from one fused call, and the AMP scale."""
        import torch

        grads = [g for p in self.params if (g := p.grad) is not None]
        if not grads:
            return [], None
        try:
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        except RuntimeError:  # sparse gradients, or parameters on several devices
            device = grads[0].device
            norms = [torch.linalg.vector_norm(g.coalesce().values() if g.is_sparse else g,
                                              dtype=torch.float32).to(device) for g in grads]
        scale = getattr(self.scaler, "_scale", None) if self.scaler is not None else None
        return norms, (scale.clone() if scale is not None else None)  # update() changes it

    def _sample_layers(self, step: int) -> None:
        listed, scale = self._tensor_norms()
        if not listed:
            return
        norms = _stack(listed)
        self._norms[step] = (norms, scale)
        self._keep_layers(step, norms if scale is None else norms / scale)

    def _open_layers(self, step: int, norms: list[float], scale: float | None) -> None:
        """A sharded layer sample, from the agreed global norms: every rank finishes it at
        this step's end, whatever its own schedule said."""
        import torch

        self._keep_layers(step, torch.tensor(norms, dtype=torch.float32) / (scale or 1.0))
        self._next_sample = min(self._next_sample, step)
        self._step_end_due = min(self._step_end_due, step)

    def _keep_layers(self, step: int, grad_norms: Any) -> None:
        layout = self._layout()
        sample = _Layers(step, layout.names, layout.numels, layout.matrix, grad_norms,
                         layout.params, layout.views, [v.clone() for v in layout.views])
        self._layers.append(sample)
        self._open_sample = sample

    def sampled_at(self, step: int) -> bool:
        """A layer sample was taken at ``step``'s backward: its end must be seen."""
        return self._open_sample is not None and self._open_sample.step == step

    def _layout(self) -> _Layout:
        """Names, sizes and sampled views of the parameters that have gradients, kept from one
        sample to the next while every parameter keeps its storage (an optimizer updates in
        place; ``model.to()`` or ``p.data = ...`` gives a new one, and a new layout)."""
        with_grad = tuple(i for i, p in enumerate(self.params) if p.grad is not None)
        params = [self.params[i] for i in with_grad]
        data = params if self._shards is None else [self._shards.local(p) for p in params]
        key = (with_grad, tuple(t.data_ptr() for t in data))
        if self._layout_cache is None or self._layout_cache.key != key:
            self._layout_cache = _Layout(key, [self.names[i] for i in with_grad],
                                         [p.numel() for p in params],  # a DTensor's: global
                                         [p.dim() >= 2 for p in params],
                                         [_sampled_view(t) for t in data], params)
        return self._layout_cache

    def _finish_layers(self, step: int) -> None:
        import torch

        sample, self._open_sample = self._open_sample, None
        if sample is None or sample.step != step or sample.views is None:
            return
        delta = torch._foreach_sub(sample.views, sample.before)  # type: ignore[arg-type]
        norms = _stacked_norms([*delta, *sample.before], sample.grad_norms.device)
        if self._shards is not None:  # each rank's sampled elements: the sums of theirs
            values, _ = self._shards.reduce(sample.params or [], norms)
            norms = torch.tensor(values, dtype=torch.float32)
        sample.update_and_weight_norms = norms
        sample.views = sample.before = None

    # to the host ---------------------------------------------------------------------------
    def take_window(self) -> Window:
        """Everything since the last window, as host values (one or two copies per device)."""
        import torch

        steps, losses, norms, layers = self._steps, self._loss, self._norms, self._layers
        activations = self.activations.take()
        tensors = [v for v in losses if isinstance(v, torch.Tensor)] if self._device_losses else []
        on_device = [(step, n) for step, n in norms.items() if isinstance(n, tuple)]
        for _, (per_tensor, scale) in on_device:
            tensors.append(per_tensor)
            if scale is not None:
                tensors.append(scale)
        for sample in layers:
            tensors += [t for t in (sample.grad_norms, sample.update_and_weight_norms)
                        if t is not None]
        for _, alive, _ in activations:
            tensors += alive.values()
        host = iter(_to_host(tensors))
        loss = [_single(next(host)) if isinstance(v, torch.Tensor) else v
                for v in losses] if self._device_losses else losses
        if steps and self.clock() - self._last_memory >= self.memory_every_s:
            self._sample_memory(steps[-1])  # slow steps: memory by time as well as by steps
        window = Window(steps=steps, loss=loss, memory=self._memory, amp=self.scaler is not None)
        if norms:
            for step, (_, scale) in on_device:
                norms[step] = _global_norm(next(host), next(host)[0] if scale is not None else None)
            window.grad_norm = list(map(norms.get, steps))  # type: ignore[arg-type]
            window._measured = list(norms.items())  # type: ignore[arg-type]  # in step order
        else:
            window.grad_norm = [None] * len(steps)
        window.layers = [_layer_sample(sample, host) for sample in layers]
        window.activations = [ActivationSample(step, {k: _share_off(next(host)) for k in alive},
                                               kinds) for step, alive, kinds in activations]
        self._learning_rate(window)
        self._adapt_stride(len(steps), bool(loss) and not self._device_losses
                           and loss[-1].__class__ is float)
        self._set_loss_jump(loss)
        self._clear()
        return window

    def _set_loss_jump(self, losses: list[float | None]) -> None:
        """The loss above which a step is looked at closer: _LOSS_JUMP x this window's mean
        (positive losses only: a log-likelihood can be negative)."""
        try:
            mean = sum(losses) / len(losses)  # type: ignore[arg-type]
        except (TypeError, ZeroDivisionError):  # no loss passed, or not on every step
            return
        self._loss_jump_at = _LOSS_JUMP * mean if mean > 0 and math.isfinite(mean) else math.inf

    def _learning_rate(self, window: Window) -> None:
        if not self.optimizers or not self.optimizers[0].param_groups:
            return
        window.lr = float(self.optimizers[0].param_groups[0]["lr"])
        window.max_lr = max((_group_lr(group) for opt in self.optimizers
                             for group in opt.param_groups), default=None)
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
        wanted = _steps_to_spread(cost_s, self.budget, self._step_s)
        self.check_every = max(self.min_check_every, min(self.max_check_every, wanted))

    def _adapt_stride(self, num_steps: int, host_losses: bool = False) -> None:
        """Auto: measure gradient norms as often as ``overhead_budget`` of the step time allows."""
        now = self.clock()
        elapsed, self._window_start = now - self._window_start, now
        costs, self._norm_costs = self._norm_costs, []
        if num_steps:
            self._step_s = elapsed / num_steps
            window_step_s = self._step_s
        else:
            window_step_s = None
        self.last_step_s = window_step_s or self.last_step_s
        if not self.auto_stride or not costs or not num_steps:
            return
        cost = sorted(costs)[len(costs) // 2]  # one preempted measurement does not count
        step_s = elapsed / num_steps
        wanted = _steps_to_spread(cost, self.budget, step_s)
        dear = host_losses and cost > _DEAR_NORM * step_s
        least = _HOST_LOSS_NORM_STRIDE if dear else 1
        self.norm_every = max(least, min(_MAX_HOST_LOSS_NORM_STRIDE if dear else _MAX_NORM_STRIDE,
                                         wanted))


def grid_every(step: int) -> int:
    """Steps between two grid steps around ``step`` (see :func:`on_grid`)."""
    return min(_GRID_EVERY, 1 << max(0, (step // 4).bit_length() - 1))


def on_grid(step: int) -> bool:
    """``step`` is one whose gradient norm exploding_gradient's skip judges: a multiple of
    :func:`grid_every` (every step below 8, every 2nd to 16, ..., every 32nd from 128)."""
    return step % grid_every(step) == 0


def grid_after(step: int) -> int:
    """The first grid step after ``step``."""
    following = step + 1
    while True:
        every = grid_every(following)
        candidate = -(-following // every) * every
        if grid_every(candidate) == every:
            return candidate
        following = candidate


def _steps_to_spread(cost_s: float, budget: float, step_s: float) -> int:
    """Over how many steps a job costing ``cost_s`` must be spread to take ``budget`` of them."""
    if step_s <= 0:
        return 1
    return math.ceil(cost_s / (budget * step_s) * (1 - 1e-9))  # 30.000000000000004 is 30


def _group_lr(group: dict[str, Any]) -> float:
    try:
        return float(group["lr"])  # a tensor lr (capturable optimizers) too
    except (KeyError, TypeError, ValueError, RuntimeError):
        return float("nan")


def _stack(norms: list[Any]) -> Any:
    import torch

    return torch.stack(norms)


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
    """Each tensor's values as numbers: on a device, one stack of the scalars and one
    concatenation of the rest, per device (usually there is one device, and no grouping to
    do); on the CPU each tensor's own list (a concatenation would only add a copy)."""
    if all(t.is_cpu for t in tensors):  # plain memory: each read where it is, nothing to gather
        return [t.reshape(-1).tolist() for t in tensors]
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


def _share_off(alive: list[float]) -> float:
    """The share of units that never fired (or stayed saturated), from their alive mask."""
    return 1.0 - sum(alive) / len(alive) if alive else float("nan")


def _layer_sample(sample: _Layers, host: Iterator[list[float]]) -> LayerSample:
    grad = next(host) if sample.grad_norms is not None else []
    rms = {name: norm / math.sqrt(max(1, numel)) for name, numel, matrix, norm
           in zip(sample.names, sample.numels, sample.matrix, grad) if matrix}
    if sample.update_and_weight_norms is None:
        return LayerSample(sample.step, rms)
    both = next(host)
    update, weight = both[:len(both) // 2], both[len(both) // 2:]
    total_weight = math.sqrt(math.fsum(w * w for w in weight))
    ratio = math.sqrt(math.fsum(u * u for u in update)) / total_weight if total_weight > 0 else None
    per_layer = {name: u / w for name, u, w in zip(sample.names, update, weight) if w > 0}
    return LayerSample(sample.step, rms, ratio, per_layer)


def saved_loss(value: Any) -> float | None:
    """A kept loss as a checkpoint holds it: a number (a device tensor read now), else None."""
    if value is None or value.__class__ is float:
        return value
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # not one number
        return None
