"""Overfit one batch in a loop that draws its own batches (no ``run.batches``).

A nanoGPT-style loop draws each batch with ``torch.randint``: there is no loader whose first
batch preflight could hand back again. What it can rewind is the random generators. This
component notes them at ``run.attach`` (the loop has not drawn yet) and puts them back after
every step, so each iteration draws the first iteration's batches again.

That only repeats a batch if the batches come from generators prudent restores (Python's,
NumPy's and torch's global ones). So the repetition is verified, not assumed: the probe
fingerprints what the model is fed in training at every step (``steps[i]["inputs"]`` of its
record), and the overfit check judges the loss only when it was the same batch again;
otherwise it says SKIP and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prudent.kernel.events import Component

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["FirstStepReplay"]


class FirstStepReplay(Component):
    """Rewinds the random generators after every step, unless run.batches repeats a batch.

    ``record`` is the probe's record: ``record["rewound"]`` says whether it did, and
    ``record["loader_repeated"]`` (set by the probe's run.batches wrapper) makes it stand back.
    """

    name = "preflight-replay"

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self._rng: dict[str, Any] | None = None

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        from prudent.kernel.rng import capture_rng

        if self._rng is None:
            self._rng = capture_rng()

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        if self._rng is None or self.record.get("loader_repeated"):
            return  # run.batches repeats the first batch itself
        from prudent.kernel.rng import restore_rng

        restore_rng(self._rng)
        self.record["rewound"] = True
