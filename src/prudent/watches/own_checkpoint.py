"""ScriptResumeWatch: a script that resumes from a checkpoint of its own while prudent runs it.

nanoGPT's ``init_from='resume'`` loads ``out/ckpt.pt`` (model, optimizer, ``iter_num``,
``best_val_loss``) before its loop. Under prudent two resumes then meet: when prudent resumed
too, its restore at ``run.attach`` overwrites what the script loaded (prudent's wins); when it
did not, prudent counts the run from step 0 while the script's state is from iteration 350, so
``run.steps(n)`` trains n more steps and the warm-up is done again. Either way the script
should leave resuming to prudent, and nothing said so.

Between ``prudent.init`` and the end of the first step, ``torch.load`` is watched (it still
loads as before): a file loaded by path whose contents look like a training checkpoint (a dict
with ``model``/``optimizer``/``state_dict`` and an iteration counter, or both of the first
two) is named once, on the console and as a ``checkpoint/script_resumed`` event. prudent's own
loads read streams, and the files under the run's folder (an adapter's framework checkpoint
that prudent restored) are its own: neither is watched.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from prudent.kernel.events import Component, EventKind

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["ScriptResumeWatch"]

_STATE_KEYS = ("model", "optimizer", "state_dict", "model_state_dict", "optimizer_state_dict")
_COUNTERS = ("iter_num", "global_step", "step", "iteration", "epoch")


class ScriptResumeWatch(Component):
    name = "script_resume"
    main_rank_only = True

    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.quiet, self.stream = quiet, stream
        self.loaded: tuple[str, str | None, Any] | None = None  # path, counter key, its value
        self._original: Any = None

    def on_start(self, run: RunContext) -> None:
        import torch

        original = self._original = torch.load
        own = run.run_dir.resolve()  # prudent's files: an adapter's framework checkpoint

        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            obj = original(f, *args, **kwargs)
            if self.loaded is None and isinstance(f, (str, os.PathLike)) \
                    and own not in Path(f).resolve().parents:
                self.loaded = _training_checkpoint(os.fspath(f), obj)
            return obj

        load.__wrapped__ = original  # type: ignore[attr-defined]
        torch.load = load

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        self._unwatch()
        run.sleep_until(self, sys.maxsize)
        if self.loaded is not None:
            self._say(run, run.state.step - 1)

    def on_end(self, run: RunContext, status: str, stop_reason: Any) -> None:
        self._unwatch()

    def _unwatch(self) -> None:
        import torch

        if self._original is not None and getattr(torch.load, "__wrapped__", None) is self._original:
            torch.load = self._original
        self._original = None

    def _say(self, run: RunContext, begun_at: int) -> None:
        path, key, value = self.loaded  # type: ignore[misc]
        held = f" ({key} {value})" if key is not None else ""
        if begun_at > 0:
            message = (f"the script loaded its own checkpoint {path}{held} before training, and "
                       f"prudent resumed this run from its checkpoint at step {begun_at}: "
                       "prudent restored the attached objects over what the script loaded "
                       "(prudent's resume wins). Under prudent leave resuming to it (nanoGPT: "
                       "init_from='scratch'), or attach what else the script keeps "
                       "(best_val_loss) so that prudent's checkpoint holds it")
        else:
            message = (f"the script resumed itself from {path}{held}, but prudent counts this "
                       "run from step 0: run.steps(n) trains n steps from here and a schedule "
                       "by step starts over (warm-up again). Leave resuming to prudent: start "
                       "from scratch once under prudent, and later starts of the same run id "
                       "resume from prudent's checkpoints")
        run.record_event(EventKind.CHECKPOINT, "script_resumed", message, path=path,
                         counter=key, value=value, prudent_step=begun_at)
        if not self.quiet:
            print(f"prudent | {run.id} | warning: {message}", file=self.stream or sys.stderr,
                  flush=True)


def _training_checkpoint(path: str, obj: Any) -> tuple[str, str | None, Any] | None:
    """(path, counter key, value) when ``obj`` looks like a training checkpoint."""
    if not isinstance(obj, dict):
        return None
    keys = {str(k) for k in obj}
    state = [k for k in _STATE_KEYS if k in keys]
    counter = next((k for k in _COUNTERS if isinstance(obj.get(k), int)), None)
    if not state or (counter is None and len(state) < 2):
        return None  # a bare state dict (pretrained weights) is no resume
    return path, counter, obj.get(counter) if counter is not None else None
