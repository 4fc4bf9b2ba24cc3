"""The sdist and the wheel `pip install prudent` would get carry what the source tree has:
every module, the price catalog, the report's scripts and styles and (when scripts/setup.sh's
`npm ci` put it there) Plotly's basic bundle; installed alone from the wheel, prudent finds
all of them.

Both are built as a release is, with `python -m build`: the sdist from the checkout, then the
wheel from the sdist, so a file the sdist forgets is missing from the wheel too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "src" / "prudent"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sdist, the wheel built from it). No isolation: the tests download nothing, the
    build backend (setuptools) is this environment's."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    (sdist,) = out.glob("prudent-*.tar.gz")
    (wheel,) = out.glob("prudent-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def wheel(dist: tuple[Path, Path]) -> Path:
    return dist[1]


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


def test_the_sdist_holds_every_module_and_data_file_the_wheel_is_built_from(
        dist: tuple[Path, Path]) -> None:
    sdist, _ = dist
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        names = {n.removeprefix(f"{top}/") for n in archive.getnames()}
    wanted = {f"src/{name}" for name in _source_files()} | {"pyproject.toml", "README.md"}
    missing = sorted(wanted - names)
    assert not missing, f"the sdist lacks {missing}"
    assert {"src/prudent/cost/prices.csv", "src/prudent/report/assets/app.js",
            "src/prudent/py.typed"} <= names


def test_the_wheel_built_from_the_sdist_runs_in_a_fresh_venv_outside_the_checkout(
        wheel: Path, tmp_path: Path) -> None:
    """`pip install prudent-*.whl` into a new virtual environment, then its `prudent` script.
    The dependencies (torch, typer, ...) are this environment's, on a .pth path line: nothing is
    downloaded, and this environment's editable prudent is not on it (a .pth inside a path
    line's folder is not read)."""
    import prudent

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(
        "\n".join(sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})) + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                                "--no-deps", "--no-index", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PRUDENT_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run([python, "-c", "import prudent; print(prudent.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.startswith(site), where.stdout + where.stderr  # the wheel's copy
    version = subprocess.run([venv / "bin" / "prudent", "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"prudent {prudent.__version__}"


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
