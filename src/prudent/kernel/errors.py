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

import dataclasses

from prudent.kernel.stop import ExitCode, StopReason

__all__ = ["ConfigError", "ExitCode", "PrudentError", "StopRun", "StoreError", "StoreLocked",
           "StoreUnavailable", "exit_code_for"]


class PrudentError(Exception):
    """Base of every error prudent raises on purpose."""


class ConfigError(PrudentError, ValueError):
    """A setting, flag or hyperparameter override is invalid. The message names the fix."""


class StoreError(PrudentError, RuntimeError):
    """The run store cannot be opened, migrated or written."""


class StoreUnavailable(StoreError):  # noqa: N818 - a state, like StoreError's kin
    """The store did not answer a read or a write (a full disk, a lock held too long, a
    server away), after the store's own retries: what was asked may succeed later."""


class StoreLocked(StoreUnavailable):  # noqa: N818
    """Another process held the store's write lock longer than the caller would wait
    (``Store.waiting_at_most``): the store itself is fine."""


class StopRun(Exception):  # noqa: N818 - the public name is fixed by the design
    """Raised by ``run.step()`` / ``run.log()`` when the run must stop; caught by ``with run:``.

    ``reason`` is one of ``preempted``, ``budget``, ``pruned``, ``rule:<name>``, ``policy``,
    ``interrupted``; it becomes the run's ``stop_reason`` and picks the exit code.
    ``stop`` is the same as a :class:`~prudent.kernel.stop.StopReason`.
    """

    def __init__(self, reason: str | StopReason, message: str = "") -> None:
        stop = reason if isinstance(reason, StopReason) else StopReason.parse(reason, message)
        message = message or stop.message
        if message != stop.message:
            stop = dataclasses.replace(stop, message=message)
        super().__init__(f"{stop}: {message}" if message else str(stop))
        self.stop = stop
        self.reason = str(stop)
        self.message = message

    @property
    def exit_code(self) -> int:
        return self.stop.exit_code


def exit_code_for(reason: str | StopReason | None) -> int:
    """The exit code for a stop reason (``None`` means the run completed)."""
    if reason is None:
        return int(ExitCode.COMPLETED)
    return (reason if isinstance(reason, StopReason) else StopReason.parse(reason)).exit_code

