"""StallWatchdog: a thread that notices when the training loop stops moving, and gets it out.

A hung loop cannot check for a stop request, so the watchdog escalates on its own clock:

1. no progress for the rule's timeout: ``on_stall`` (dump stacks, fire the rule's actions);
2. a stop is pending and still no progress ``grace_s`` later: ``interrupt()``, which sends
   SIGUSR2 to the main thread; prudent's handler raises ``StopRun`` there, which also breaks
   a blocking call (``time.sleep``, a queue or socket wait) and unwinds through ``with run:``;
3. still nothing after another ``grace_s`` (a C call that ignores signals, a dead collective):
   ``hard_exit()`` records the stop and ends the process with exit code 3.

The thread reads the run's counters (step, epoch, batches, logs) every ``poll_s``: the training
thread does nothing at all for it. Any change re-arms the watchdog; so does the loop reaching
its stop check by itself (the kernel's ``stop_requested`` event).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["StallWatchdog", "dump_stacks"]


class StallWatchdog:
    def __init__(self, *, timeout_s: float, startup_timeout_s: float, grace_s: float,
                 progress: Callable[[], tuple[int, Any]],
                 on_stall: Callable[[float, bool], bool], stop_pending: Callable[[], bool],
                 interrupt: Callable[[], None], hard_exit: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.startup_timeout_s, self.grace_s = timeout_s, startup_timeout_s, grace_s
        self.progress, self.on_stall, self.stop_pending = progress, on_stall, stop_pending
        self.interrupt, self.hard_exit = interrupt, hard_exit
        self.clock = clock
        self.poll_s = max(0.05, min(1.0, timeout_s / 4, grace_s / 4))
        self.last = clock()
        self._seen = progress()
        self._first_step = self._seen[0]
        self.fired_at: float | None = None
        self.stage = 0  # 0 watching, 1 fired, 2 interrupted, 3 exited
        self.unwinding = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """A step has completed since the watchdog started (the startup timeout is over)."""
        return self._seen[0] != self._first_step

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="prudent-stall-watchdog",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.tick()

    def tick(self) -> None:
        """One look at the clock (the thread's body; tests call it with a fake clock)."""
        now = self.clock()
        current = self.progress()
        if current != self._seen:
            self._seen, self.last = current, now
        if self.fired_at is not None and self.last > self.fired_at:
            self.fired_at, self.stage = None, 0  # it moved again: watch afresh
        if self.fired_at is None:
            if self.on_stall(now - self.last, self.started):
                self.fired_at, self.stage = now, 1
            return
        self._escalate(now - self.fired_at)

    def _escalate(self, since_fired: float) -> None:
        if self.unwinding or not self.stop_pending():
            return
        if self.stage == 1 and since_fired >= self.grace_s:
            self.stage = 2
            self.interrupt()
        elif self.stage == 2 and since_fired >= 2 * self.grace_s:
            self.stage = 3
            self.hard_exit()


def dump_stacks(path: Path, header: str) -> None:
    """Every thread's Python stack, main thread first, into ``path``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    frames = sorted(sys._current_frames().items(), key=lambda item: item[0] != main)
    lines = [header.rstrip() + "\n"]
    for ident, frame in frames:
        lines.append(f"\nThread {names.get(ident, '?')} (ident {ident}):\n")
        lines.extend(traceback.format_stack(frame))
    path.write_text("".join(lines))
