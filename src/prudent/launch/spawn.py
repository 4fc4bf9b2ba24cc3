"""Starting a child with a :class:`~prudent.launch.spec.LaunchSpec`: the one way prudent does it.

``prudent run``, ``tune`` (its workers, and each worker's trials), ``preflight`` and ``replay``
all start children here. The child's environment is a copy of this process's with the spec's
variables on top; this process's own ``os.environ`` is never changed. On Linux a child gets
SIGTERM when its parent dies, so a killed parent leaves no orphan training on. While a
:class:`SignalForwarder` is active, SIGINT/SIGTERM/SIGHUP reach the children once each and a
third signal kills them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any

from prudent.launch.spec import LaunchSpec

__all__ = ["FORWARDED_SIGNALS", "SignalForwarder", "child_environ", "die_with_parent", "spawn"]

# SIGUSR1: SLURM's warning ahead of the time limit (--signal=B:USR1@120); left unhandled it
# would kill the supervisor and orphan the child in the middle of its save
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                     *((signal.SIGUSR1,) if hasattr(signal, "SIGUSR1") else ()))
_KILL_AT = 3  # the third signal kills: a child that ignores two requests is stuck


def child_environ(spec: LaunchSpec, *, extra: Mapping[str, str] | None = None,
                  drop: Iterable[str] = (), base: Mapping[str, str] | None = None
                  ) -> dict[str, str]:
    """A new dict: ``base`` (this process's environment) less ``drop``, plus ``extra`` and the
    spec's variables, which win."""
    dropped = set(drop)
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in dropped}
    env.update(extra or {})
    env.update(spec.to_env())
    return env


def spawn(command: Sequence[str], spec: LaunchSpec, *, extra: Mapping[str, str] | None = None,
          drop: Iterable[str] = (), new_session: bool = True,
          death_signal: int = signal.SIGTERM, **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``command`` with the spec's environment, tied to this process's life.

    ``new_session`` keeps a terminal's Ctrl-C from reaching the child directly (a
    :class:`SignalForwarder` passes it on once); replay turns it off so that pdb keeps the
    terminal. ``death_signal`` is what the child gets if this process dies: SIGTERM lets a
    training run checkpoint; a throwaway smoke run (preflight) gets SIGKILL. ``popen`` goes
    to :class:`subprocess.Popen` (stdout, stderr, stdin ...).
    """
    return subprocess.Popen(list(command), env=child_environ(spec, extra=extra, drop=drop),
                            start_new_session=new_session,
                            preexec_fn=functools.partial(die_with_parent, death_signal), **popen)


def die_with_parent(death_signal: int = signal.SIGTERM) -> None:
    """Linux: this (just forked) child gets ``death_signal`` when its parent dies (no
    orphans)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(death_signal))  # PR_SET_PDEATHSIG
        except OSError:
            pass


class SignalForwarder:
    """``with SignalForwarder() as fwd: fwd.add(spawn(...))``: pass signals on to the children.

    Each of SIGINT, SIGTERM and SIGHUP counts (:attr:`signals_seen`) and goes to every live
    child; the third kills them (``kill_message`` is printed then). Outside the main thread
    (``prudent.tune()`` in a thread) nothing is installed: Python allows handlers only there.
    """

    def __init__(self, kill_message: str | None = None) -> None:
        self.kill_message = kill_message
        self.children: list[subprocess.Popen[bytes]] = []
        self.signals_seen = 0
        self.signals: set[int] = set()  # which ones
        self._previous: dict[int, Any] = {}

    def add(self, child: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.children.append(child)
        return child

    def __enter__(self) -> SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self.forward) for sig in FORWARDED_SIGNALS}
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def forward(self, signum: int, _frame: FrameType | None = None) -> None:
        """The handler: count the signal, pass it on (or kill, the third time)."""
        self.signals_seen += 1
        self.signals.add(signum)
        alive = [c for c in self.children if c.poll() is None]
        if self.signals_seen >= _KILL_AT and alive and self.kill_message:
            print(self.kill_message, file=sys.stderr)
        for child in alive:
            if self.signals_seen >= _KILL_AT:
                child.kill()
            else:
                child.send_signal(signum)
