"""The tracking thread: a tracker that is down keeps its rows and gets them when it answers;
one that stays down or refuses loses rows, counted; training never notices."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import prudent
from prudent.kernel.errors import ConfigError
from prudent.store.recorder import MetricsRecorder
from prudent.testing import make_settings
from prudent.tracking.base import TrackerRefused, TrackerSink, require
from prudent.tracking.component import TrackingComponent
from prudent.tracking.dispatch import TrackingDispatcher
from prudent.tracking.settings import TrackingSettings


class FlakySink(TrackerSink):
    """A tracker that is down until ``up`` is set (or always raises, or refuses)."""

    name = "flaky"

    def __init__(self, up: bool = True, refuse: bool = False) -> None:
        self.up = threading.Event()
        if up:
            self.up.set()
        self.refuse = refuse
        self.metrics: list[tuple[int, float]] = []
        self.calls: list[str] = []
        self.closed_as: str | None = None

    def open(self) -> None:
        self._check()

    def write_metrics(self, rows: list[dict[str, Any]]) -> None:
        self._check()
        if self.refuse:
            raise TrackerRefused("no such metric name")
        self.metrics += [(r["step"], r["value"]) for r in rows]

    def write_events(self, rows: list[dict[str, Any]]) -> None:
        self._check()
        self.calls += [f"event:{r['kind']}/{r['name']}" for r in rows]

    def write_config(self, config: dict[str, Any]) -> None:
        self.calls.append(f"config:{sorted(config)}")

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._check()
        self.calls.append(f"summary:{summary['status']}")

    def close(self, status: str) -> None:
        self.closed_as = status

    def _check(self) -> None:
        if not self.up.is_set():
            raise ConnectionError("connection refused")


def metric_rows(steps: range) -> list[dict[str, Any]]:
    return [{"step": s, "name": "loss", "value": float(s), "wall": 0.0} for s in steps]


def test_a_tracker_that_was_down_gets_its_rows_once_it_answers() -> None:
    sink = FlakySink(up=False)
    dispatcher = TrackingDispatcher([sink], flush_interval_s=0.05)
    dispatcher.take(metric_rows(range(1, 11)), [])
    time.sleep(0.2)
    assert sink.metrics == []
    sink.up.set()
    dispatcher.close(timeout_s=5)  # a closing dispatcher tries again at once
    assert sink.metrics == [(s, float(s)) for s in range(1, 11)]
    assert dispatcher.num_dropped == 0 and sink.closed_as == "completed"


def test_rows_past_the_bound_are_dropped_oldest_first_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    sink = FlakySink(up=False)
    dispatcher = TrackingDispatcher([sink], flush_interval_s=0.05, max_buffered_rows=25)
    for start in range(1, 41, 10):
        dispatcher.take(metric_rows(range(start, start + 10)), [])
    time.sleep(0.2)
    sink.up.set()
    dispatcher.close(timeout_s=5)
    assert sink.metrics == [(s, float(s)) for s in range(21, 41)]
    assert dispatcher.num_dropped == 20
    assert "dropped 10 rows for flaky" in caplog.text


def test_a_tracker_still_down_at_the_end_drops_what_waited_and_counts_it(
        caplog: pytest.LogCaptureFixture) -> None:
    sink = FlakySink(up=False)
    dispatcher = TrackingDispatcher([sink], flush_interval_s=0.05)
    dispatcher.take(metric_rows(range(1, 6)), [])
    started = time.monotonic()
    dispatcher.close(timeout_s=1.5)
    assert time.monotonic() - started < 3
    assert dispatcher.num_dropped == 5 and sink.closed_as == "completed"
    assert "could not be reached before the run ended" in caplog.text
    assert "cannot write to flaky (ConnectionError: connection refused)" in caplog.text


def test_rows_a_tracker_refuses_are_dropped_and_the_rest_still_goes() -> None:
    refusing, healthy = FlakySink(refuse=True), FlakySink()
    dispatcher = TrackingDispatcher([refusing, healthy], flush_interval_s=0.05)
    dispatcher.take(metric_rows(range(1, 4)), [])
    dispatcher.put("summary", {"status": "completed"})
    dispatcher.close()
    assert dispatcher.num_dropped == 3 and refusing.calls == ["summary:completed"]
    assert healthy.metrics == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_tracker_that_always_raises_never_reaches_training(home: Path) -> None:
    sink = FlakySink(up=False)
    component = TrackingComponent(TrackingSettings(flush_interval_s=0.05, close_timeout_s=1),
                                  sinks=[sink])
    run = prudent.init(name="down", settings=make_settings(home), exit_on_stop=False,
                       components=[MetricsRecorder(every_s=0.01), component])
    started = time.monotonic()
    with run:
        for step in run.steps(50):
            run.step(loss=float(step))
    assert run.context.status == "completed" and time.monotonic() - started < 5
    assert component.dispatcher is not None and component.dispatcher.num_dropped > 50
    assert sink.metrics == [] and sink.closed_as == "completed"


def test_a_run_hands_config_metrics_events_and_summary_in_order(home: Path) -> None:
    sink = FlakySink()
    component = TrackingComponent(TrackingSettings(), sinks=[sink])
    run = prudent.init(name="order", config={"lr": 0.1, "epochs": 2},
                       settings=make_settings(home), exit_on_stop=False,
                       components=[MetricsRecorder(), component])
    with run:
        for step in run.steps(5):
            run.step(loss=float(step))
    assert sink.calls[0] == "config:['epochs', 'lr']"
    assert sink.calls[-2:] == ["summary:completed", "event:lifecycle/end"]
    assert run.config.was_read("epochs") is False  # sending the config is not the script's read
    assert sink.metrics == [(s, float(s - 1)) for s in range(1, 6)]


def test_a_configured_tracker_that_is_not_installed_names_the_extra() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'prudent\[nosuch\]'"):
        require("prudent_no_such_module", "nosuch")


def test_no_tracker_configured_or_started_costs_no_thread(home: Path) -> None:
    run = prudent.init(name="plain", settings=make_settings(home), exit_on_stop=False)
    (component,) = [c for c in run.context.components if isinstance(c, TrackingComponent)]
    assert component.dispatcher is None
    assert "prudent-tracking" not in [t.name for t in threading.enumerate()]
    with run:
        run.step()
