"""Why a run stopped, as a value: its kind, the rule that fired, the message, the exit code.

The string form is the documented ``stop_reason`` of ``prudent show --json`` and the store
(``preempted``, ``budget``, ``pruned``, ``policy``, ``interrupted``, ``error``,
``rule:<name>``); code that needs a fact reads the fields, never the string.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import NoReturn

__all__ = ["ENV_LAUNCHER_ERROR_FILE", "ExitCode", "StopKind", "StopReason",
           "exit_bad_input", "refusal_exit_wait_s", "tell_launcher"]

ENV_LAUNCHER_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"


class ExitCode(IntEnum):
    """Process exit codes, so a supervisor (prudent's, Kubernetes, SLURM) knows what happened."""

    COMPLETED = 0
    ERROR = 1  # the script raised: Python's own code for an uncaught exception
    BAD_INPUT = 2  # a setting, flag or --set value is wrong; nothing ran
    RULE = 3  # a monitoring rule stopped the run (stop_reason "rule:<name>")
    BUDGET = 4  # the run reached its budget; resumable once the budget is raised
    PRUNED = 5  # the tuner pruned this trial
    POLICY = 6  # the run would break the policy
    PREEMPTED = 75  # EX_TEMPFAIL: the machine is going away; relaunch and resume
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it


class StopKind(str, Enum):
    """The kinds of stop; each has one exit code."""

    PREEMPTED = "preempted"
    BUDGET = "budget"
    PRUNED = "pruned"
    POLICY = "policy"
    INTERRUPTED = "interrupted"
    RULE = "rule"
    ERROR = "error"
    # a prudent tool's own end of a child's run; the parent reads the record, not the code
    PREFLIGHT = "preflight"
    REPLAY = "replay"

    @property
    def exit_code(self) -> ExitCode:
        return _EXIT_CODES[self]


_EXIT_CODES = {
    StopKind.PREEMPTED: ExitCode.PREEMPTED, StopKind.BUDGET: ExitCode.BUDGET,
    StopKind.PRUNED: ExitCode.PRUNED, StopKind.POLICY: ExitCode.POLICY,
    StopKind.INTERRUPTED: ExitCode.INTERRUPTED, StopKind.RULE: ExitCode.RULE,
    StopKind.ERROR: ExitCode.ERROR, StopKind.PREFLIGHT: ExitCode.ERROR,
    StopKind.REPLAY: ExitCode.ERROR,
}
# a supervisor relaunches these: the same command can go on from the last checkpoint
_RESUMABLE = {StopKind.PREEMPTED}


@dataclass(frozen=True)
class StopReason:
    """One stop: ``kind``, the ``rule`` that fired (kind ``rule``; for kind ``pruned``, the
    rule that pruned the trial, or None when the pruner did) and a ``message`` for a person.
    ``str(reason)`` is the documented ``stop_reason`` string. ``finished``: the stop means the
    training is done (early stopping after progress), not that something is wrong: the run
    ends *completed*, exit 0, and the code after ``with run:`` runs."""

    kind: StopKind
    rule: str | None = None
    message: str = ""
    finished: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StopKind(self.kind))
        if self.kind is StopKind.RULE and not self.rule:
            raise ValueError("a stop of kind 'rule' names the rule that fired")
        if self.rule and self.kind not in (StopKind.RULE, StopKind.PRUNED):
            raise ValueError(f"a stop of kind {self.kind.value!r} names no rule, got "
                             f"rule={self.rule!r}")

    def __str__(self) -> str:
        return f"rule:{self.rule}" if self.kind is StopKind.RULE else self.kind.value

    @classmethod
    def by_rule(cls, rule: str, message: str = "", *, finished: bool = False) -> StopReason:
        return cls(StopKind.RULE, rule, message, finished)

    @classmethod
    def pruned(cls, message: str = "", rule: str | None = None) -> StopReason:
        """The tuner's stop: by its pruner (``rule`` None) or by a monitoring rule."""
        return cls(StopKind.PRUNED, rule, message)

    @classmethod
    def parse(cls, text: str, message: str = "") -> StopReason:
        """The reason a ``stop_reason`` string stands for (unknown words are errors)."""
        if text.startswith("rule:"):
            return cls(StopKind.RULE, text[5:] or "unknown", message)
        try:
            return cls(StopKind(text), None, message)
        except ValueError:
            return cls(StopKind.ERROR, None, message or text)

    @classmethod
    def from_exit_code(cls, code: int) -> StopReason | None:
        """The reason a supervisor infers when it only saw the exit code (None: completed)."""
        if code == ExitCode.COMPLETED:
            return None
        if code == ExitCode.RULE:
            return cls.by_rule("unknown")
        for kind, value in _EXIT_CODES.items():
            if value == code and kind not in (StopKind.RULE, StopKind.PREFLIGHT, StopKind.REPLAY):
                return cls(kind)
        return cls(StopKind.ERROR)

    @property
    def exit_code(self) -> int:
        return int(self.kind.exit_code)

    @property
    def resumable(self) -> bool:
        """True when relaunching the same command continues the run (a preempted machine)."""
        return self.kind in _RESUMABLE

    @property
    def is_failure(self) -> bool:
        return self.kind is StopKind.ERROR

    @property
    def ends_early(self) -> bool:
        """Stopped by the tuner or a rule before its planned end: the rest would be waste."""
        return self.kind in (StopKind.PRUNED, StopKind.RULE)


def tell_launcher(code: int, message: str) -> None:
    """Under torchrun, leave this worker's end in the error file torchrun gave it: torchrun
    exits 1 whatever its workers' codes, but copies the first failed worker's file, with its
    exit code, into its own error file, which ``prudent run`` reads (per node: the one way a
    node whose ranks write no record tells its supervisor why they stopped)."""
    path = os.environ.get(ENV_LAUNCHER_ERROR_FILE)
    if not path or code == 0:
        return
    error = {"message": {"message": f"prudent: {message}",
                         "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as stream:
            json.dump(error, stream)
    except OSError:
        pass  # the exit code still says it on this node's own process


def exit_bad_input(message: str) -> NoReturn:
    """Refuse the run: one line naming the fix, the launcher told, exit 2 (under torchrun in
    the order that lets every node's ``prudent run`` say 2, ``refusal_exit_wait_s``)."""
    import sys

    print(f"prudent: error: {message}", file=sys.stderr, flush=True)
    tell_launcher(int(ExitCode.BAD_INPUT), f"bad input: {message}")
    time.sleep(refusal_exit_wait_s())
    raise SystemExit(int(ExitCode.BAD_INPUT))


def refusal_exit_wait_s(environ: Mapping[str, str] | None = None) -> float:
    """How long a rank that refuses the run (bad input: every rank refuses alike) waits before
    it exits, so that each node's ``prudent run`` learns the code. The first worker to exit
    makes its torchrun end the others: the ranks on rank 0's node wait for rank 0 to write the
    record (5 s); with several nodes rank 0 waits too (2 s), since its node's torchrun hosts the
    rendezvous and the other nodes' torchruns must pass their workers' code on before it goes."""
    env = os.environ if environ is None else environ
    rank, node = int(env.get("RANK", 0)), int(env.get("GROUP_RANK", 0))
    if rank == 0:
        return 2.0 if int(env.get("GROUP_WORLD_SIZE", 1)) > 1 else 0.0
    return 5.0 if node == 0 else 0.0
