"""ActivationProbe: forward hooks on activation modules, attached only on sampled steps.

A module with a forward hook sends every call through PyTorch's slow path, so the hooks exist
only while a sample is being taken. Each hook reduces the activation on the device to one
mask (which units fired in this batch); nothing is copied to the host. A unit that fired for
no example at all is dead (ReLU) or saturated (sigmoid, tanh). Small batches say little about
"never", so a sample spans as many steps as it takes to see ``min_examples`` examples.

Under data parallelism (DDP, FSDP2) each rank judges its own examples: no collective (the
hooks are armed on each rank's own schedule), so a rank's smaller batch takes more steps to
reach ``min_examples``, and a unit that fired only on another rank's examples counts as
dead on this one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ActivationProbe"]

_EPS = 1e-3  # sigmoid/tanh derivative below ~1e-3: the unit passes almost no gradient
_MAX_STEPS = 16  # a sample never keeps the hooks on for longer than this


class ActivationProbe:
    def __init__(self, min_examples: int = 32) -> None:
        self.min_examples = min_examples
        self.targets: list[tuple[str, Any, str]] = []
        self.armed_step = 0
        self._handles: list[Any] = []
        self._alive: dict[str, Any] = {}
        self._kinds: dict[str, str] = {}
        self._examples: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        self._steps = 0
        self._done: list[tuple[int, dict[str, Any], dict[str, str]]] = []

    def find(self, modules: list[tuple[str, Any]]) -> None:
        """Remember the ReLU / ReLU6 / Sigmoid / Tanh modules of the attached models."""
        from torch import nn

        kinds = ((nn.ReLU, "dead"), (nn.ReLU6, "dead"), (nn.Sigmoid, "sigmoid"),
                 (nn.Tanh, "tanh"))
        seen = {id(m) for _, m, _ in self.targets}
        prefix_them = len(modules) > 1
        for prefix, model in modules:
            for name, module in model.named_modules():
                kind = next((k for cls, k in kinds if isinstance(module, cls)), None)
                if kind is not None and id(module) not in seen:
                    seen.add(id(module))
                    label = f"{prefix}.{name}" if prefix_them else name
                    self.targets.append((label.strip(".") or prefix, module, kind))

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self, step: int) -> None:
        """Hook the activations from the next forward pass on (unless a sample is open)."""
        if not self.targets or self._handles:
            return
        self.armed_step, self._steps = step, 0
        self._alive, self._kinds, self._examples = {}, {}, {}
        self._handles = [module.register_forward_hook(self._hook(name, kind))
                         for name, module, kind in self.targets]
        self._calls.clear()

    def step_done(self) -> None:
        """After a step: close the sample once it has seen enough examples."""
        if not self._handles:
            return
        self._calls.clear()  # the next forward pass numbers reused modules from 1 again
        self._steps += 1
        seen = min(self._examples.values(), default=0)
        if seen >= self.min_examples or self._steps >= _MAX_STEPS or not self._examples:
            self.disarm()

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._alive:
            self._done.append((self.armed_step, self._alive, self._kinds))
            self._alive = {}

    def take(self) -> list[tuple[int, dict[str, Any], dict[str, str]]]:
        """Closed samples: ``(step, {name: which units fired, a bool tensor}, {name: kind})``
        (the share that never fired is worked out on the host: no device ops for it)."""
        done, self._done = self._done, []
        return done

    def _hook(self, name: str, kind: str) -> Any:
        def hook(module: Any, _inputs: Any, output: Any) -> None:
            if not module.training or not hasattr(output, "dim") or output.dim() < 2:
                return
            calls = self._calls[name] = self._calls.get(name, 0) + 1
            label = name if calls == 1 else f"{name}#{calls}"  # a module reused in forward
            alive = _alive_units(output.detach(), kind)
            previous = self._alive.get(label)
            self._alive[label] = alive if previous is None or previous.shape != alive.shape \
                else previous | alive
            self._kinds[label] = "dead" if kind == "dead" else "saturated"
            self._examples[label] = self._examples.get(label, 0) + output.shape[0]

        return hook


def _alive_units(output: Any, kind: str) -> Any:
    """Which units were active for some example: a unit is a channel of a convolution's output
    (N, C, H, W), the last dimension otherwise (N, F) or (N, T, F)."""
    units = 1 if output.dim() >= 4 else output.dim() - 1
    if kind == "dead":
        # each unit's largest value, reduced in place (no mask, no copy): `(x > 0).any(0)`
        # cost 5x more at width 1024 and grew with the width. A NaN counts as firing: it is
        # non_finite's to name, not a dead unit
        top = output.amax(tuple(d for d in range(output.dim()) if d != units))
        return (top > 0) | top.isnan()
    flat = output.movedim(units, -1).reshape(-1, output.shape[units])
    if kind == "sigmoid":
        return ((flat > _EPS) & (flat < 1 - _EPS)).any(0)
    return (flat.abs() < 1 - _EPS).any(0)
