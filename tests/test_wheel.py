"""The wheel `pip install prudent` would get carries what the source tree has: every module,
the price catalog, the report's scripts and styles and (when scripts/setup.sh's `npm ci` put
it there) Plotly's basic bundle; installed alone from it, prudent finds all of them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "src" / "prudent"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("prudent-*.whl")
    return found


def _source_files() -> set[str]:
    """What the wheel must hold: the modules and the package data pyproject.toml names."""
    wanted = {p for p in PACKAGE.rglob("*.py") if "node_modules" not in p.parts}
    wanted |= {PACKAGE / "py.typed", *PACKAGE.glob("cost/*.csv"),
               *PACKAGE.glob("report/assets/*")}
    bundle = PACKAGE / "report" / "node_modules" / "plotly.js-basic-dist-min"
    wanted |= set(bundle.glob("*"))  # present once `npm ci` ran (scripts/setup.sh)
    return {f"prudent/{p.relative_to(PACKAGE).as_posix()}" for p in wanted
            if "__pycache__" not in p.parts}


def test_the_wheel_holds_every_module_and_data_file_of_the_source_tree(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_files() - names)
    assert not missing, f"the wheel lacks {missing}"
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    extras = {line.split(":", 1)[1].strip() for line in
              zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
              if line.startswith("Provides-Extra:")}
    assert {"s3", "ft", "tensorboard", "mlflow", "wandb", "postgres", "ui"} <= extras


def test_prudent_installed_from_the_wheel_alone_finds_its_data(wheel: Path,
                                                               tmp_path: Path) -> None:
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                                "--target", str(target), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import prudent\n"
        "assert prudent.__file__.startswith(sys.argv[1]), prudent.__file__\n"
        "from prudent.cost.catalog import load_catalog\n"
        "print(load_catalog().lookup('aws:g5.xlarge').num_gpus)\n"
        "from prudent.report.render import asset, bundle_for, chart_js\n"
        "assert asset('app.js') and asset('app.css')\n"
        "print(len(chart_js(bundle_for('run'))) > 100_000)\n")
    ran = subprocess.run([sys.executable, "-c", probe, str(target)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["1", "True"]


@pytest.mark.slow
def test_the_wheel_installed_outside_the_checkout_runs_the_demo_and_reports_it(
        wheel: Path, tmp_path: Path) -> None:
    """What a user of `pip install prudent` does first, from the wheel alone (its dependencies
    from this environment), in a folder that is not the checkout: --version, the digits example
    under `prudent run`, its report with the charts inside, the price catalog."""
    import os
    import shutil

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "examples" / "digits.py", project / "digits.py")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")},
           "PYTHONPATH": str(target), "PRUDENT_CONSOLE": "off"}

    def prudent(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "prudent", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=timeout)

    where = subprocess.run([sys.executable, "-c", "import prudent; print(prudent.__file__)"],
                           cwd=project, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(target))  # the wheel's, not the checkout's
    version = prudent("--version")
    assert version.returncode == 0 and version.stdout.startswith("prudent "), version.stderr
    trained = prudent("run", "--run-id", "demo", "--", sys.executable, "digits.py", timeout=600)
    assert trained.returncode == 0, trained.stderr[-2000:]
    report = prudent("report", "demo", "-o", "demo.html")
    assert report.returncode == 0, report.stderr
    page = (project / "demo.html").read_text()
    assert "Plotly" in page and len(page) > 1_000_000  # the chart bundle is inside the page
    catalog = prudent("catalog", "--cloud", "aws")
    assert catalog.returncode == 0 and "g5.xlarge" in catalog.stdout, catalog.stderr
