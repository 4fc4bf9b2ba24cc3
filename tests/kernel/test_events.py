from __future__ import annotations

import inspect

from prudent.kernel.events import Component, Event


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


def test_every_recorded_event_uses_a_listed_kind_and_name() -> None:
    """Other code (tune, the bill, the report) reads the record by (kind, name): each pair is
    a constant listed in events.py, never a string made up at the call site."""
    import ast
    from pathlib import Path

    from prudent.kernel.events import RECORDED_EVENTS, EventKind

    src = Path(__file__).resolve().parents[2] / "src" / "prudent"
    problems = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "record_event" and node.args):
                continue
            where = f"{path.relative_to(src)}:{node.lineno}"
            kind = node.args[0]
            if not (isinstance(kind, ast.Attribute) and isinstance(kind.value, ast.Name)
                    and kind.value.id == "EventKind" and kind.attr in EventKind.__members__):
                problems.append(f"{where}: kind is not an EventKind member")
                continue
            names = RECORDED_EVENTS[EventKind[kind.attr]]
            name = node.args[1] if len(node.args) > 1 else None
            if names is not None and not (isinstance(name, ast.Constant) and name.value in names):
                problems.append(f"{where}: name {ast.unparse(name) if name else None} is not "
                                f"listed for {kind.attr}")
    assert problems == []
    assert set(RECORDED_EVENTS) == set(EventKind)
