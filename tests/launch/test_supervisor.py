from __future__ import annotations

import signal
import sys
import time

import pytest

from prudent.kernel.errors import ConfigError
from prudent.launch.supervisor import Supervisor, _verdict
from prudent.store.database import Store
from prudent.wiring.config import ProjectSettings

EXIT_2 = [sys.executable, "-c", "import sys; sys.exit(2)"]


@pytest.mark.parametrize(("code", "relaunch"), [
    (75, True), (1, True), (-9, True),  # preempted, crashed, killed: relaunch
    (0, False), (2, False), (3, False), (4, False), (5, False), (6, False), (127, False), (130, False),
])
def test_only_preemption_and_crashes_are_relaunched(settings: ProjectSettings, code: int,
                                                    relaunch: bool) -> None:
    supervisor = Supervisor(["true"], settings, max_restarts=3)
    assert supervisor._should_relaunch(code, attempt=0) is relaunch
    assert supervisor._should_relaunch(code, attempt=3) is False  # out of restarts


def test_a_signal_from_the_user_prevents_relaunch(settings: ProjectSettings) -> None:
    supervisor = Supervisor(["true"], settings, max_restarts=3)
    supervisor.forwarder.forward(signal.SIGINT)  # no child running: only counted
    assert supervisor.signals_seen == 1
    assert not supervisor._should_relaunch(75, attempt=0)


@pytest.mark.parametrize(("code", "expected"), [
    (-9, ("failed", "error")), (0, ("completed", None)), (75, ("stopped", "preempted")),
    (4, ("stopped", "budget")), (3, ("stopped", "rule:unknown")), (2, ("failed", "error")),
])
def test_verdict_for_a_child_that_did_not_close_its_record(code: int, expected: tuple[str, str | None]) -> None:
    assert _verdict(code)[:2] == expected


def test_bad_arguments_are_config_errors(settings: ProjectSettings) -> None:
    with pytest.raises(ConfigError, match="--max-restarts must be >= 0"):
        Supervisor(["true"], settings, max_restarts=-1)
    with pytest.raises(ConfigError, match="no command to run"):
        Supervisor([], settings)


def test_a_child_refused_before_it_started_leaves_no_run(settings: ProjectSettings) -> None:
    assert Supervisor(EXIT_2, settings, run_id="typo", max_restarts=2).run() == 2
    store = Store.open(settings.store)
    try:
        assert store.get_run("typo") is None and store.list_runs() == []
    finally:
        store.close()


def test_a_bad_input_exit_of_a_run_that_existed_or_recorded_something_is_kept(
        settings: ProjectSettings) -> None:
    store = Store.open(settings.store)
    try:
        store.create_run("older", "train")
        assert Supervisor(EXIT_2, settings, run_id="older").run() == 2  # a relaunch: kept
        assert store.get_run("older")["status"] == "failed"
        supervisor = Supervisor(EXIT_2, settings, run_id="started")
        assert supervisor._register(store) is True
        store.add_events([{"run_id": "started", "step": 0, "kind": "lifecycle", "name": "start",
                           "message": "", "payload": "{}", "wall": time.time()}])
        assert not supervisor._refused(store, 2)  # its prudent.init got that far: a real run
        assert not Supervisor(EXIT_2, settings, run_id="new")._refused(store, 1)
    finally:
        store.close()
