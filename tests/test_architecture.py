"""The shape the design promises, checked: a kernel that knows no plug-in, no import cycle,
no module reaching into another's private members (STYLE.md rules 3, 22-24)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "prudent"

# The kernel: what a Run needs to exist, and the store it writes to. Everything else is a
# plug-in, an adapter or a command. The folders say which is which.
KERNEL_PACKAGES = ("prudent.kernel", "prudent.store")


def _kernel_modules() -> set[str]:
    found = {"prudent"}
    for package in KERNEL_PACKAGES:
        folder = SRC.parent.joinpath(*package.split("."))
        found.update(_module_name(path) for path in folder.rglob("*.py"))
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


KERNEL = _kernel_modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module: str, is_package: bool, *, in_functions: bool) -> set[str]:
    """prudent modules ``module`` imports: at load time, or also inside its functions (never
    those imported for type checking only)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                found.update(_with_packages({a.name for a in node.names
                                             if a.name.startswith("prudent")}))
            elif isinstance(node, ast.ImportFrom):
                found.update(_from_targets(node, module, is_package))
            elif in_functions or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.ClassDef, ast.Lambda)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        visit([c for c in children if isinstance(c, (ast.stmt,
                                                                     ast.ExceptHandler))])
                if isinstance(node, ast.ExceptHandler):
                    visit(node.body)

    visit(tree.body)
    return found - {"prudent"}  # the root package only re-exports the public API, lazily


def _from_targets(node: ast.ImportFrom, module: str, is_package: bool) -> set[str]:
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    if not base.startswith("prudent"):
        return set()
    # `from prudent.pkg import sub` imports the submodule when there is one
    subs = {f"{base}.{a.name}" for a in node.names if _exists(f"{base}.{a.name}")}
    return _with_packages(subs or {base})


def _with_packages(modules: set[str]) -> set[str]:
    """Importing ``prudent.a.b`` first runs ``prudent/a/__init__``: that is an import too (the
    root package, everyone's parent, is left out: it only re-exports the public API)."""
    found = set(modules)
    for module in modules:
        parts = module.split(".")
        found.update(".".join(parts[:i]) for i in range(2, len(parts)))
    return found


def _exists(module: str) -> bool:
    path = SRC.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph(*, in_functions: bool = False) -> dict[str, set[str]]:
    graph = {}
    for path in SRC.rglob("*.py"):
        name = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        imports = _imports(tree, name, path.name == "__init__.py", in_functions=in_functions)
        graph[name] = imports - {name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                strongconnect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return cycles


def test_no_import_cycle_inside_prudent() -> None:
    """Not even through an import inside a function: a deferred import that breaks a cycle at
    load time still ties two modules that should not know each other."""
    assert find_cycles(import_graph(in_functions=True)) == []


def test_the_kernel_imports_no_plug_in() -> None:
    code = ("import prudent.kernel.run, prudent.kernel.context, sys; "
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('prudent'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert set(loaded) - KERNEL == set()


def test_the_kernel_modules_import_only_the_kernel_at_load_time() -> None:
    graph = import_graph()
    leaks = {m: sorted(graph[m] - KERNEL) for m in KERNEL if m in graph and graph[m] - KERNEL}
    assert leaks == {}


def test_no_module_touches_a_private_member_of_the_run() -> None:
    """Components see the RunContext; the Run's private state is the kernel's alone."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name in ("run.py", "context.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                    and node.value.id in ("run", "ctx", "context")):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {node.value.id}.{node.attr}")
    assert offenders == []


def test_the_settings_reach_only_each_plug_ins_settings_module() -> None:
    """``config.py`` assembles prudent.yaml from the plug-ins' own settings models: it imports
    those, the kernel and the launch spec, never a component."""
    allowed = KERNEL | {"prudent.launch", "prudent.launch.spec", "prudent.wiring"}
    imported = import_graph(in_functions=True)["prudent.wiring.config"]
    plug_in_packages = {m for m in imported if not m.endswith(".settings")} - allowed
    packages_of_settings = {m.rsplit(".", 1)[0] for m in imported if m.endswith(".settings")}
    assert plug_in_packages - packages_of_settings == set()


def test_the_package_root_holds_only_the_front_door() -> None:
    """A contributor's first look is the architecture: the kernel, the store, the wiring, the
    launcher, the plug-ins, the adapters and the views each have their folder. At the root:
    the public API, the command line, the testing helpers, and the adapters' public import
    paths (each the same module object as its ``prudent.adapters`` or ``prudent.distributed``
    home)."""
    loose = sorted(p.name for p in SRC.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py", "fault_tolerant.py", "keras.py",
                     "lightning.py", "testing.py", "transformers.py"]
    for alias, home in [("lightning", "adapters.lightning"), ("keras", "adapters.keras"),
                        ("transformers", "adapters.transformers"),
                        ("fault_tolerant", "distributed.fault_tolerant")]:
        assert f"prudent.{home}" in (SRC / f"{alias}.py").read_text()
        assert _all_of(SRC / f"{alias}.py") == _all_of(SRC.joinpath(*home.split(".")).with_suffix(
            ".py")), f"prudent.{alias} must export what prudent.{home} does"


def _all_of(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{path} has no __all__")
