from __future__ import annotations

import inspect

from prudent.events import Component, Event


def test_every_event_has_a_component_method_and_every_method_an_event() -> None:
    methods = {name for name, _ in inspect.getmembers(Component, inspect.isfunction)
               if name.startswith("on_")}
    assert methods == {event.method_name for event in Event}


def test_overrides_detects_only_redefined_handlers() -> None:
    class OnlyLog(Component):
        def on_log(self, run, metrics):  # type: ignore[no-untyped-def]
            pass

    component = OnlyLog()
    assert component.overrides(Event.LOG)
    assert not any(component.overrides(e) for e in Event if e is not Event.LOG)
