"""Overfit one batch in a loop that draws its own batches (no ``run.batches``).

A nanoGPT-style loop draws each batch with ``torch.randint``: there is no loader whose first
batch preflight could hand back again. What it can rewind is the random generators. This
component notes them at ``run.attach`` (the loop has not drawn yet) and puts them back after
every step, so each iteration draws the first iteration's batches again.

That only repeats a batch if the batches come from generators prudent restores (Python's,
NumPy's and torch's global ones). So the repetition is verified, not assumed: the model's
training inputs of the first steps are fingerprinted, and the overfit check judges the loss
only when they were the same batch again; otherwise it says SKIP and why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prudent.events import Component

if TYPE_CHECKING:
    from prudent.context import RunContext

__all__ = ["FINGERPRINTED_STEPS", "FirstStepReplay", "fingerprint"]

FINGERPRINTED_STEPS = 6  # steps whose training inputs are compared (0-based step numbers)


class FirstStepReplay(Component):
    """Rewinds the random generators after every step, while the loop never used run.batches.

    ``record`` is the probe's record: ``record["replay"]`` says whether generators were
    rewound and holds one fingerprint per early step of everything the model was fed in
    training (``inputs``), for the overfit check to confirm the batches repeated.
    """

    name = "preflight-replay"

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.replay: dict[str, Any] = {"rewound": False, "inputs": []}
        record["replay"] = self.replay
        self._rng: dict[str, Any] | None = None
        self._ctx: RunContext | None = None
        self._digest: Any = None
        self._digest_step = -1
        self._hooks: list[Any] = []

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        import torch

        from prudent.rng import capture_rng

        self._ctx = run
        if self._rng is None:
            self._rng = capture_rng()
        for obj in objects.values():
            if isinstance(obj, torch.nn.Module):
                self._hooks.append(obj.register_forward_pre_hook(self._fed, with_kwargs=True))

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        self._close_digest()
        if self._rng is None or self.record.get("loader_repeated"):
            return  # run.batches repeats the first batch itself
        from prudent.rng import restore_rng

        restore_rng(self._rng)
        self.replay["rewound"] = True

    def on_end(self, run: RunContext, status: str, stop_reason: Any) -> None:
        for hook in self._hooks:
            hook.remove()

    def _fed(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Fold a training forward's inputs into the current step's fingerprint."""
        step = self._ctx.state.step if self._ctx is not None else 0
        if not module.training or step >= FINGERPRINTED_STEPS:
            return
        if self._digest is None or self._digest_step != step:
            self._close_digest()
            self._digest, self._digest_step = hashlib.blake2b(digest_size=16), step
        fingerprint(args, self._digest)
        fingerprint(kwargs, self._digest)

    def _close_digest(self) -> None:
        if self._digest is not None:
            self.replay["inputs"].append(self._digest.hexdigest())
            self._digest = None


def fingerprint(obj: Any, digest: Any) -> None:
    """Feed every tensor, array and plain value of a nested structure into ``digest``."""
    import torch

    if isinstance(obj, torch.Tensor):
        data = obj.detach().cpu().contiguous().view(-1)
        digest.update(f"{data.dtype}{tuple(obj.shape)}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    elif isinstance(obj, Mapping):
        for key in obj:
            digest.update(repr(key).encode())
            fingerprint(obj[key], digest)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            fingerprint(item, digest)
    else:
        digest.update(repr(obj).encode())
