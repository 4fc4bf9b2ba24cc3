"""The reference pages, generated from the code: every prudent.yaml setting from the pydantic
settings models (``prudent.wiring.config.ProjectSettings``, one section per component) and every
command of the CLI with its options (typer's click command).

Used by ``gen_reference.py`` at ``mkdocs build`` and by ``tests/test_docs.py``, which checks
that no settings field is missing from the page.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

import typer
import yaml
from pydantic import BaseModel, SecretStr

from prudent.cli import app
from prudent.launch.spec import ENV_SETTINGS
from prudent.wiring.config import ProjectSettings


@dataclass(frozen=True)
class Setting:
    path: str  # dotted, from the section: "checkpoint.every", "monitor.rules.stalled.grace_s"
    type: str
    default: str
    variable: str  # the PRUDENT_* variable that sets it, or ""
    description: str


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (nested section), or None for a plain value."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _optional_model_of(annotation: Any) -> type[BaseModel] | None:
    """The model of a ``Model | None`` field (a part that is off until it is set)."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    models = [a for a in typing.get_args(annotation) if _model_of(a)]
    return models[0] if len(models) == 1 else None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _default(value: Any) -> str:
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    except yaml.YAMLError:
        text = str(value)
    return text.removesuffix("\n...").removesuffix("...").strip()


def settings(model: type[BaseModel] = ProjectSettings, prefix: str = "") -> list[Setting]:
    """Every leaf field of the settings models, depth first, in declaration order."""
    env = {".".join(where): var for var, where in ENV_SETTINGS.items()}
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _model_of(field.annotation)
        if nested is not None:
            rows.extend(settings(nested, path + "."))
            continue
        default = field.get_default(call_default_factory=True)
        rows.append(Setting(path, _type_name(field.annotation), _default(default),
                            env.get(path, ""), " ".join((field.description or "").split())))
        optional = _optional_model_of(field.annotation)
        if optional is not None:  # its own settings, once it is set
            rows.extend(settings(optional, path + "."))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_markdown() -> str:
    """The settings reference: one table per section of prudent.yaml."""
    out = []
    for section, field in ProjectSettings.model_fields.items():
        model = _model_of(field.annotation)
        assert model is not None, section
        doc = inspect.cleandoc(model.__doc__ or "").split("\n\n")[0]
        out += [f"## `{section}`", "", " ".join(doc.split()), "",
                "| setting | type | default | variable | description |", "|---|---|---|---|---|"]
        for s in settings(model, section + "."):
            var = f"`{s.variable}`" if s.variable else ""
            out.append(f"| `{s.path}` | {_cell(s.type)} | `{_cell(s.default)}` | {var} "
                       f"| {_cell(s.description)} |")
        out.append("")
    return "\n".join(out)


def _commands(group: Any, prefix: str) -> list[tuple[str, Any]]:
    found = []
    for name in group.commands:  # the order they were registered in
        command = group.commands[name]
        if getattr(command, "hidden", False):
            continue
        found.append((f"{prefix} {name}", command))
        if hasattr(command, "commands"):
            found.extend(_commands(command, f"{prefix} {name}"))
    return found


def commands() -> list[tuple[str, Any]]:
    """Every (full name, click command) of the CLI, groups included."""
    return _commands(typer.main.get_command(app), "prudent")


def _first_line(command: Any) -> str:
    return " ".join((command.help or "").split("\n\n")[0].split()).split(". ")[0].rstrip(".")


def _param_row(param: Any) -> str:
    if param.param_type_name == "argument":
        names = f"`{(param.metavar or param.name).upper()}`"
    else:
        value = "" if getattr(param, "is_flag", False) or not param.metavar else f" {param.metavar}"
        names = ", ".join(f"`{o}{value}`" for o in [*param.opts, *param.secondary_opts])
    default = param.default
    unset = default is None or default is False or default in ((), [])
    shown = "" if unset or param.param_type_name == "argument" else f"`{_cell(_default(default))}`"
    help_text = " ".join((getattr(param, "help", None) or "").split())
    required = " (required)" if param.required else ""
    repeatable = getattr(param, "multiple", False) and "repeatable" not in help_text
    repeat = " (repeatable)" if repeatable else ""
    return f"| {_cell(names)} | {shown} | {_cell(help_text)}{required}{repeat} |"


def _help_markdown(text: str | None) -> list[str]:
    """A command's help, one paragraph a line; its ``Example: prudent ...`` as a shell block."""
    out = []
    for paragraph in inspect.cleandoc(text or "").split("\n\n"):
        if paragraph.startswith("Example: "):
            out += ["Example:", "", f"```sh\n{paragraph.removeprefix('Example: ')}\n```"]
        else:
            out.append(" ".join(paragraph.split()))
        out.append("")
    return out[:-1]


def _usage(name: str, command: Any) -> str:
    ctx = typer.main.get_command(app).context_class(command, info_name=name)
    return " ".join([name, *command.collect_usage_pieces(ctx)])


def cli_markdown() -> str:
    """The CLI reference: a table of the commands, then each one's usage, help and options."""
    found = commands()
    out = ["| command | what it does |", "|---|---|"]
    out += [f"| [`{name}`](#{anchor(name)}) | {_cell(_first_line(command))} |"
            for name, command in found]
    out.append("")
    for name, command in found:
        out += [f"## `{name}`", "", f"```\n{_usage(name, command)}\n```", "",
                *_help_markdown(command.help), ""]
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        if hasattr(command, "commands") and not params:
            out += ["Commands: " + ", ".join(f"`{name} {c}`" for c in sorted(command.commands)),
                    ""]
            continue
        if params:
            out += ["| option | default | what it does |", "|---|---|---|"]
            out += [_param_row(p) for p in params]
            out.append("")
    return "\n".join(out)


def anchor(title: str) -> str:
    """The id MkDocs gives a heading (Python-Markdown's toc slugify)."""
    text = re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)
