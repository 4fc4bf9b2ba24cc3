"""The stalled rule's watchdog: when it fires, how it escalates, and a real hung loop."""

from __future__ import annotations

import io
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import prudent
from prudent.monitor import Monitor
from prudent.monitor.watchdog import StallWatchdog, dump_stacks
from prudent.store.database import Store
from prudent.testing import FakeClock, make_settings


class Loop:
    """What the watchdog sees of a training loop, and what it did about it."""

    def __init__(self) -> None:
        self.step = 0
        self.stop_pending = False
        self.calls: list[str] = []

    def watchdog(self, clock: FakeClock, **limits: float) -> StallWatchdog:
        return StallWatchdog(
            timeout_s=limits.get("timeout_s", 10), grace_s=limits.get("grace_s", 5),
            startup_timeout_s=limits.get("startup_timeout_s", 60),
            progress=lambda: (self.step, ()), on_stall=self.on_stall,
            stop_pending=lambda: self.stop_pending,
            interrupt=lambda: self.calls.append("interrupt"),
            hard_exit=lambda: self.calls.append("hard_exit"), clock=clock)

    def on_stall(self, idle_s: float, started: bool) -> bool:
        limit = 10 if started else 60
        if idle_s < limit:
            return False
        self.calls.append(f"stall after {idle_s:g} s ({'started' if started else 'startup'})")
        self.stop_pending = True
        return True


def test_fires_after_the_timeout_and_rearms_when_the_loop_moves_again() -> None:
    clock, loop = FakeClock(), Loop()
    watchdog = loop.watchdog(clock)
    loop.step = 1
    watchdog.tick()  # sees step 1: the startup phase is over
    clock.advance(9.5)
    watchdog.tick()
    assert loop.calls == []
    clock.advance(1)
    watchdog.tick()
    assert loop.calls == ["stall after 10.5 s (started)"]
    loop.step, loop.stop_pending = 2, False
    clock.advance(1)
    watchdog.tick()  # progress: watching afresh
    clock.advance(10)
    watchdog.tick()
    assert loop.calls[-1] == "stall after 10 s (started)"


def test_the_first_step_gets_the_longer_startup_timeout() -> None:
    clock, loop = FakeClock(), Loop()
    watchdog = loop.watchdog(clock)
    clock.advance(59)
    watchdog.tick()
    assert loop.calls == [] and not watchdog.started
    clock.advance(2)
    watchdog.tick()
    assert loop.calls == ["stall after 61 s (startup)"]


def test_a_stuck_loop_is_interrupted_after_grace_then_ended_after_twice_that() -> None:
    clock, loop = FakeClock(), Loop()
    watchdog = loop.watchdog(clock)
    loop.step = 1
    watchdog.tick()
    for seconds in (11, 4, 1, 4, 1, 10):
        clock.advance(seconds)
        watchdog.tick()
    assert loop.calls == ["stall after 11 s (started)", "interrupt", "hard_exit"]


@pytest.mark.parametrize("reason", ["no stop requested", "loop reached its stop check"])
def test_no_escalation_without_a_pending_stop_or_once_the_loop_unwinds(reason: str) -> None:
    clock, loop = FakeClock(), Loop()
    watchdog = loop.watchdog(clock)
    loop.step = 1
    watchdog.tick()
    clock.advance(11)
    watchdog.tick()
    if reason == "no stop requested":
        loop.stop_pending = False
    else:
        watchdog.unwinding = True
    clock.advance(100)
    watchdog.tick()
    assert loop.calls == ["stall after 11 s (started)"]


def test_stack_dump_has_every_thread_main_first(tmp_path: Path) -> None:
    release = threading.Event()

    def waiting_for_data() -> None:
        release.wait(30)

    helper = threading.Thread(target=waiting_for_data, name="loader-worker")
    helper.start()
    try:
        dump_stacks(tmp_path / "stacks.txt", "prudent: stalled at step 7")
    finally:
        release.set()
        helper.join()
    text = (tmp_path / "stacks.txt").read_text()
    assert text.startswith("prudent: stalled at step 7\n\nThread MainThread")
    assert "Thread loader-worker" in text and "in waiting_for_data" in text


def hung_run(home: Path, action: str, hang_s: float) -> tuple[prudent.Run, float]:
    settings = make_settings(home, monitor={"rules": {"stalled": {
        "timeout_s": 0.4, "grace_s": 0.4, "action": action}}})
    run = prudent.init(name="hang", settings=settings, exit_on_stop=False,
                       components=[Monitor(settings.monitor, stream=io.StringIO())])
    started = time.monotonic()
    with run:
        for step in run.batches(range(5)):
            if step == 3:
                time.sleep(hang_s)  # a dead mount, a deadlocked loader worker
            run.step(loss=1.0)
    return run, time.monotonic() - started


def test_a_hung_loop_is_interrupted_and_stopped_with_the_stacks_saved(home: Path) -> None:
    run, took = hung_run(home, "stop", hang_s=60)
    assert (run.status, run.stop_reason, run.exit_code) == ("stopped", "rule:stalled", 3)
    assert took < 10  # timeout 0.4 s + grace 0.4 s, polled every 0.1 s
    stacks = (run.context.run_dir / "stalled-stacks.txt").read_text()
    assert "training stalled: no step for" in stacks and "in hung_run" in stacks
    assert "time.sleep(hang_s)" in stacks
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # handler restored


def test_an_alert_only_stall_lets_a_slow_loop_finish(home: Path) -> None:
    run, _ = hung_run(home, "alert", hang_s=1.5)
    assert run.status == "completed" and run.state.step == 5
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    events: list[dict[str, Any]] = [e for e in store.events(run.id) if e["kind"] == "rule"]
    store.close()
    assert [(e["name"], e["payload"]["action"]) for e in events] == [("stalled", ["alert"])]
