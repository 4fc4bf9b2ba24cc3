"""UnreadConfigWatch: a hyperparameter set from outside that the script does not read.

``prudent run --set lr=0.5`` records lr=0.5; a script that takes its hyperparameters from its
own globals (nanoGPT's configurator) and never from ``run.config`` trains on its own value,
and the record lies. ``run.config`` notes what the script read
(:class:`~prudent.wiring.hparams.TrackedConfig`); this component looks once, when a script has read
its configuration: at the end of the first epoch or after the first 1% of the planned
``run.steps(n)``, whichever comes first, else at the end of a run that completed (a stop
before then may come before a read). A key set from outside
(``--set``, a trial's values) and not read by then is a warning on the console and a
``config/unread`` event. In a trial of ``prudent tune`` the trial stops there, and its worker
fails it (it reads the event) rather than scoring the script's own values.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from prudent.kernel.events import Component, EventKind
from prudent.kernel.stop import StopKind, StopReason
from prudent.launch.spec import LaunchSpec
from prudent.wiring.hparams import TrackedConfig

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext

__all__ = ["UnreadConfigWatch"]

_NEVER = sys.maxsize  # sleep_until: no more STEP_END for this component


class UnreadConfigWatch(Component):
    """Names the keys of ``overrides`` the script has not read from ``run.config`` by the end
    of the first epoch, the first 1% of the planned steps, or the run. ``trial``: the trial's
    number under ``prudent tune`` (an unread key then stops the trial)."""

    name = "unread_config"
    main_rank_only = True

    def __init__(self, overrides: Mapping[str, Any], *, trial: int | None = None,
                 quiet: bool = False, stream: TextIO | None = None) -> None:
        self.given = dict(overrides)  # not `overrides`: a Component method
        self.trial = trial
        self.quiet, self.stream = quiet, stream
        self.judged = False  # kept in checkpoints: a resumed run does not judge again
        self._due: int | None = None

    @classmethod
    def build(cls, spec: LaunchSpec, quiet: bool = False) -> UnreadConfigWatch | None:
        """The component when this process was given overrides; else None."""
        if not spec.overrides:
            return None
        return cls(spec.overrides, trial=spec.trial.number if spec.trial else None, quiet=quiet)

    # events -------------------------------------------------------------------------------
    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        state = run.state
        if self.judged or state.num_steps is None:  # an epoch's end or the run's end judges
            run.sleep_until(self, _NEVER)
            return
        if self._due is None:  # this process's first step: 1% of the plan from here
            self._due = state.step - 1 + max(1, math.ceil(state.num_steps / 100))
        if state.step < self._due:
            run.sleep_until(self, self._due)
            return
        self._judge(run, f"step {state.step} (1% of the {state.num_steps} planned steps)")
        run.sleep_until(self, _NEVER)

    def on_epoch_end(self, run: RunContext, epoch: int) -> None:
        if not self.judged:
            self._judge(run, f"the end of epoch {epoch + 1}")

    def on_end(self, run: RunContext, status: str, reason: StopReason | None) -> None:
        # a stop before the judging point (a rule, the pruner, a preemption) may come before
        # the script reads a key (tune_train.py reads one after its first epoch's batches)
        if not self.judged and status == "completed":
            self._judge(run, "the end of the run", stop=False)

    def state_dict(self) -> dict[str, Any]:
        return {"judged": self.judged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.judged = bool(state.get("judged", False))

    # judging ------------------------------------------------------------------------------
    def _judge(self, run: RunContext, when: str, stop: bool = True) -> None:
        self.judged = True
        config = run.config
        if not isinstance(config, TrackedConfig):
            return  # built by hand, not by prudent.init: reads were not noted
        unread = {k: v for k, v in self.given.items() if not config.was_read(k)}
        if not unread:
            return
        message = self._message(unread, when)
        run.record_event(EventKind.CONFIG, "unread", message, keys=sorted(unread),
                         values=unread, trial=self.trial, when=when)
        self._say(run, f"warning: {message}")
        if stop and self.trial is not None:
            run.request_stop(StopReason(StopKind.ERROR, None, message))

    def _message(self, unread: Mapping[str, Any], when: str) -> str:
        one = len(unread) == 1
        pairs = ", ".join(f"{k}={_show(v)}" for k, v in unread.items())
        values = "value" if one else "values"
        fix = (f"Read {'it' if one else 'them'} from run.config ({_lookup(next(iter(unread)))})"
               " or, for configurator-style globals (nanoGPT), add "
               "globals().update(run.config) after prudent.init")
        was = "was" if one else "were"
        if self.trial is not None:
            return (f"{pairs} {was} not read from run.config by {when} (trial {self.trial} of "
                    f"prudent tune): the trial fails rather than be scored on the script's own "
                    f"{values}. {fix}")
        return (f"--set {pairs} {was} not read from run.config by {when}: the run records "
                f"{'it' if one else 'them'} but trains on the script's own {values}. {fix} (a "
                "key read only after training, such as an output path, can be read before "
                "the loop)")

    def _say(self, run: RunContext, text: str) -> None:
        if not self.quiet:
            print(f"prudent | {run.id} | {text}", file=self.stream or sys.stderr, flush=True)


def _show(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _lookup(key: str) -> str:
    """``model.hidden`` -> ``run.config["model"]["hidden"]``."""
    return "run.config" + "".join(f'["{part}"]' for part in key.split("."))
