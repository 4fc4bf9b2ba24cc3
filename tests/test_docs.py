"""The documentation site (mkdocs.yml, docs/) and the README: the generated references hold
every setting and every command, every page is in the nav, the README lists every extra, and
the Getting started page's code runs as written.

``.ci/run`` builds the site with ``mkdocs build --strict`` (broken links, missing pages); these
tests need no MkDocs.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer
import yaml
from pydantic import BaseModel

from prudent.cli import app
from prudent.wiring.config import ProjectSettings, load_settings

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
# Python blocks of the Getting started page that are not run, each with its reason
NOT_RUN = {
    'run.steps(cfg["max_iters"])': "a sketch of nanoGPT's loop around nanoGPT's own GPT, get_batch,"
                                   " get_lr and estimate_loss; tests/e2e/scripts/nanogpt.py runs it",
}


@functools.cache
def reference() -> ModuleType:
    """docs/_gen/reference.py, the generator the site's build runs."""
    name = "prudent_docs_reference"
    spec = importlib.util.spec_from_file_location(name, DOCS / "_gen" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def model_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every setting's dotted path, read from the models themselves: the leaves, and a part
    that is off until set (``tracking.mlflow: MlflowSettings | None``) with its own fields."""
    paths = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if is_model(annotation):
            paths += model_fields(annotation, f"{prefix}{name}.")
            continue
        paths.append(f"{prefix}{name}")
        for arg in typing.get_args(annotation) if type(None) in typing.get_args(annotation) else ():
            paths += model_fields(arg, f"{prefix}{name}.") if is_model(arg) else []
    return paths


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def test_every_settings_field_is_in_the_generated_settings_reference() -> None:
    page = reference().settings_markdown()
    paths = model_fields(ProjectSettings)
    assert len(paths) > 100 and {"checkpoint.every", "tracking.mlflow.tracking_uri"} <= set(paths)
    missing = [p for p in paths if f"| `{p}` |" not in page]
    assert not missing, f"settings missing from docs/reference/settings.md: {missing}"


def test_every_command_and_option_is_in_the_generated_cli_reference() -> None:
    page = reference().cli_markdown()

    def walk(group: Any, prefix: str) -> list[tuple[str, Any]]:
        found = []
        for name, command in group.commands.items():
            found.append((f"{prefix} {name}", command))
            found += walk(command, f"{prefix} {name}") if hasattr(command, "commands") else []
        return found

    commands = walk(typer.main.get_command(app), "prudent")
    assert {"prudent run", "prudent tune", "prudent policy check"} <= {n for n, _ in commands}
    for name, command in commands:
        section = page.split(f"## `{name}`\n", 1)
        assert len(section) == 2, f"{name} is missing from the CLI reference"
        body = section[1].split("\n## ", 1)[0]
        for param in command.params:
            for opt in param.opts if param.param_type_name == "option" else []:
                assert f"`{opt}" in body, f"{name} {opt} is missing from the CLI reference"


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    def entries(nav: Any) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        items = nav.values() if isinstance(nav, dict) else nav
        return [page for item in items for page in entries(item)]

    nav = entries(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
             if "_gen" not in p.parts}
    assert len(nav) == len(set(nav))
    assert set(nav) == pages


def test_the_readme_lists_every_extra() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    table = [line for line in readme.splitlines() if line.startswith("| `")]
    missing = [e for e in extras if not any(f"`{e}`" in row.split("|")[1] for row in table)]
    assert not missing, f"extras missing from the README's table: {missing}"


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme


def test_the_settings_page_examples_are_valid_settings(tmp_path: Path) -> None:
    blocks = code_blocks((DOCS / "reference" / "settings.md").read_text(), "yaml")
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"prudent-{i}.yaml"
        path.write_text(block)
        assert isinstance(load_settings(path, environ={}), ProjectSettings)


def test_the_readme_runs_the_getting_started_script() -> None:
    readme = code_blocks((ROOT / "README.md").read_text(), "python")
    assert readme and readme[0] == code_blocks(GETTING_STARTED.read_text(), "python")[0]


@pytest.mark.parametrize("index", range(len(code_blocks(GETTING_STARTED.read_text(), "python"))))
def test_getting_started_code_runs_as_written(index: int, tmp_path: Path) -> None:
    block = code_blocks(GETTING_STARTED.read_text(), "python")[index]
    reasons = [why for marker, why in NOT_RUN.items() if marker in block]
    if reasons:
        pytest.skip(reasons[0])
    script = tmp_path / "train.py"
    script.write_text(block)
    env = {**os.environ, "PRUDENT_HOME": str(tmp_path / ".prudent"), "PRUDENT_CONSOLE": "off"}
    for var in ("PRUDENT_RUN_ID", "PRUDENT_CONFIG", "PRUDENT_STORE_URL", "PRUDENT_SET"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_block_left_out_is_still_on_the_page() -> None:
    blocks = code_blocks(GETTING_STARTED.read_text(), "python")
    for marker in NOT_RUN:
        assert sum(marker in b for b in blocks) == 1, marker


API_PAGE = DOCS / "reference" / "python.md"


def _directives(page: str) -> dict[str, str]:
    """mkdocstrings' ``::: identifier`` blocks of a page: identifier -> its options' text."""
    blocks = re.split(r"^::: ", page, flags=re.M)[1:]
    return {block.split("\n", 1)[0].strip(): block.split("\n\n", 1)[0] for block in blocks}


def _all_of(module: str) -> list[str]:
    """A module's ``__all__``, read from its source (the adapters import their framework)."""
    import ast

    path = ROOT / "src" / Path(*module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


def test_the_python_api_page_documents_every_public_name() -> None:
    """docs/reference/python.md (rendered from the docstrings by mkdocstrings at `mkdocs build
    --strict`, which fails on a name it cannot find) has a block for each name of
    ``prudent.__all__``, of each framework adapter's, and of the monitor's rule API."""
    import prudent
    import prudent.monitor

    directives = _directives(API_PAGE.read_text())
    missing = [f"prudent.{name}" for name in prudent.__all__ if f"prudent.{name}" not in directives]
    for name in prudent.monitor.__all__:  # documented where it is defined, imported from here
        defined = f"{getattr(prudent.monitor, name).__module__}.{name}"
        missing += [] if defined in directives else [defined]
    for adapter in ("prudent.lightning", "prudent.transformers", "prudent.keras"):
        options = directives.get(adapter, "")
        members = re.search(r"members: \[(.*?)\]", options)
        listed = {m.strip() for m in members.group(1).split(",")} if members else set()
        missing += [f"{adapter}.{name}" for name in _all_of(adapter) if name not in listed]
    assert not missing, f"docs/reference/python.md lacks {missing}"
