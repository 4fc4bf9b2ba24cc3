"""prudent's exceptions and the exit codes a stopped run leaves behind.

::

    PrudentError                    anything prudent raises on purpose
    ├── ConfigError (ValueError)    bad settings, bad --set, bad run id: exit code 2, nothing written
    └── StoreError (RuntimeError)   the run store cannot be read or written
    StopRun (Exception)             control flow, not a failure: the run must stop cleanly

``StopRun`` is deliberately not a ``PrudentError``: it is raised from ``run.step()`` /
``run.log()`` to unwind the user's loop to ``with run:``, and a broad
``except PrudentError`` in user code must not swallow it.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ConfigError", "ExitCode", "PrudentError", "StopRun", "StoreError", "exit_code_for"]


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


class PrudentError(Exception):
    """Base of every error prudent raises on purpose."""


class ConfigError(PrudentError, ValueError):
    """A setting, flag or hyperparameter override is invalid. The message names the fix."""


class StoreError(PrudentError, RuntimeError):
    """The run store cannot be opened, migrated or written."""


class StopRun(Exception):  # noqa: N818 - the public name is fixed by the design
    """Raised by ``run.step()`` / ``run.log()`` when the run must stop; caught by ``with run:``.

    ``reason`` is one of ``preempted``, ``budget``, ``pruned``, ``rule:<name>``, ``policy``,
    ``interrupted``; it becomes the run's ``stop_reason`` and picks the exit code.
    """

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.reason)


_REASON_CODES = {
    "preempted": ExitCode.PREEMPTED,
    "budget": ExitCode.BUDGET,
    "pruned": ExitCode.PRUNED,
    "policy": ExitCode.POLICY,
    "interrupted": ExitCode.INTERRUPTED,
    "error": ExitCode.ERROR,
}


def exit_code_for(reason: str | None) -> int:
    """The exit code for a stop reason (``None`` means the run completed)."""
    if reason is None:
        return int(ExitCode.COMPLETED)
    if reason.startswith("rule:"):
        return int(ExitCode.RULE)
    return int(_REASON_CODES.get(reason, ExitCode.ERROR))


def reason_for_exit_code(code: int) -> str | None:
    """The inverse of :func:`exit_code_for`, for a supervisor that only saw the exit code."""
    if code == ExitCode.COMPLETED:
        return None
    if code == ExitCode.RULE:
        return "rule:unknown"
    for reason, value in _REASON_CODES.items():
        if value == code:
            return reason
    return "error"
