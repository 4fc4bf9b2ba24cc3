"""The launch recipes in examples/launch/: every file parses, says what the README says, and the
SLURM script turns SLURM's SIGUSR1 into one SIGTERM for ``prudent run`` and requeues on exit 75.

The SLURM script runs here with a stand-in ``prudent`` on the PATH (a shell script that waits
for SIGTERM), so its signal and exit-code handling is tested in a second; tests/e2e/
test_launch_recipes.py replays each platform's signals against a real training run.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parents[1]
LAUNCH = ROOT / "examples" / "launch"
SKYPILOT = LAUNCH / "skypilot.yaml"
SLURM = LAUNCH / "slurm.sbatch"
KUBERNETES = LAUNCH / "kubernetes.yaml"
SAGEMAKER = LAUNCH / "sagemaker" / "launch.py"
SAGEMAKER_ENTRY = LAUNCH / "sagemaker" / "entry.sh"
SECTION = "## Launching in the cloud"


# extracting the command lines -------------------------------------------------------------
def shell_commands(text: str) -> list[str]:
    """``prudent run ...`` lines of a shell script, less a leading ``exec`` and a trailing ``&``."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        line = line.removeprefix("exec ").removesuffix(" &")
        if line.startswith("prudent run "):
            found.append(line)
    return found


def kubernetes_commands(manifest: dict[str, Any]) -> list[str]:
    containers = manifest["spec"]["template"]["spec"]["containers"]
    return [" ".join(c.get("command", []) + c.get("args", [])) for c in containers]


def recipe_commands(path: Path) -> list[str]:
    """The ``prudent run`` command lines a recipe file launches."""
    if path == KUBERNETES:
        return kubernetes_commands(yaml.safe_load(path.read_text()))
    if path == SKYPILOT:
        return shell_commands(yaml.safe_load(path.read_text())["run"])
    if path.suffix == ".py":
        return []  # the estimator: its entry point (entry.sh) holds the command
    return shell_commands(path.read_text())


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else None]


def readme_recipes() -> dict[str, tuple[list[Path], list[str]]]:
    """Each ``###`` recipe of the README section: the files it links and the command lines in
    its code blocks (a ``command: [...]`` line is a Kubernetes container's command)."""
    recipes = {}
    for block in readme_section().split("\n### ")[1:]:
        title = block.splitlines()[0]
        links = [ROOT / p for p in dict.fromkeys(re.findall(r"\((examples/launch/[^)]+)\)", block))]
        code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", block, flags=re.S))
        commands = shell_commands(code)
        for line in code.splitlines():
            if line.startswith("command:"):
                commands.append(" ".join(yaml.safe_load(line)["command"]))
        recipes[title] = (links, commands)
    return recipes


# every file parses --------------------------------------------------------------------------
def test_every_recipe_file_is_linked_from_the_readme() -> None:
    linked = {p for links, _ in readme_recipes().values() for p in links}
    files = {p for p in LAUNCH.rglob("*") if p.is_file() and p.name != "requirements.txt"}
    assert files == linked
    assert len(readme_recipes()) == 4


def test_skypilot_task_resumes_by_task_id_and_leaves_relaunching_to_skypilot() -> None:
    task = yaml.safe_load(SKYPILOT.read_text())
    assert task["resources"]["use_spot"] is True
    assert 75 in task["resources"]["job_recovery"]["recover_on_exit_codes"]
    assert task["envs"]["CHECKPOINT_ROOT"].startswith("s3://")
    assert 'PRUDENT_CHECKPOINT_URL="${CHECKPOINT_ROOT}/${SKYPILOT_TASK_ID}"' in task["run"]
    [command] = recipe_commands(SKYPILOT)
    assert '--run-id "${SKYPILOT_TASK_ID}" --max-restarts 0 --' in command
    for block in ("setup", "run"):
        assert subprocess.run(["bash", "-n"], input=task[block], text=True).returncode == 0


def test_kubernetes_job_names_the_run_and_outlasts_the_checkpoint_stall() -> None:
    job = yaml.safe_load(KUBERNETES.read_text())
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert pod["terminationGracePeriodSeconds"] > 30  # more than the default
    assert job["spec"]["backoffLimit"] >= 1
    rules = job["spec"]["podFailurePolicy"]["rules"]
    ignored = [r["onExitCodes"]["values"] for r in rules
               if r["action"] == "Ignore" and "onExitCodes" in r]
    assert [75] in ignored
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['batch.kubernetes.io/job-name']"
    assert env["PRUDENT_CHECKPOINT_URL"]["value"] == "$(CHECKPOINT_ROOT)/$(JOB_NAME)"
    assert env["CHECKPOINT_ROOT"]["value"].startswith("s3://")
    assert recipe_commands(KUBERNETES) == [
        "prudent run --run-id $(JOB_NAME) --max-restarts 0 -- python train.py"]


def test_sagemaker_snippet_parses_without_the_sdk_and_asks_for_spot_with_checkpoints() -> None:
    tree = ast.parse(SAGEMAKER.read_text())
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in top_level if "sagemaker" in ast.unparse(n)]
    [call] = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name) and n.func.id == "PyTorch"]
    args = {k.arg: k.value for k in call.keywords}
    assert ast.literal_eval(args["use_spot_instances"]) is True
    assert _arithmetic(args["max_wait"]) >= _arithmetic(args["max_run"])
    assert ast.literal_eval(args["checkpoint_local_path"]) == "/opt/ml/checkpoints"
    assert "checkpoint_s3_uri" in args
    assert ast.literal_eval(args["entry_point"]) == SAGEMAKER_ENTRY.name
    assert subprocess.run(["sh", "-n", str(SAGEMAKER_ENTRY)]).returncode == 0
    [command] = recipe_commands(SAGEMAKER_ENTRY)
    assert '--run-id "$TRAINING_JOB_NAME"' in command


def _arithmetic(node: ast.expr) -> int:
    return eval(compile(ast.Expression(node), "<launch.py>", "eval"), {"__builtins__": {}})


def test_slurm_script_asks_for_the_signal_and_requeue_and_parses() -> None:
    text = SLURM.read_text()
    assert "#SBATCH --signal=B:USR1@120" in text and "#SBATCH --requeue" in text
    assert subprocess.run(["bash", "-n", str(SLURM)]).returncode == 0
    [command] = recipe_commands(SLURM)
    assert command.startswith('prudent run --run-id "slurm-${SLURM_JOB_ID}"')


# the README says what the files do ------------------------------------------------------
def test_readme_command_lines_are_exactly_those_of_the_recipes() -> None:
    for title, (links, documented) in readme_recipes().items():
        in_files = [c for path in links for c in recipe_commands(path)]
        assert in_files, f"{title}: the linked files launch no prudent run"
        assert documented == in_files, title


# the SLURM script's signal handling, with a stand-in prudent ----------------------------
FAKE_PRUDENT = """#!/bin/bash
echo "$@" > "$FAKE_LOG/args"
if [ -n "${FAKE_EXIT:-}" ]; then exit "$FAKE_EXIT"; fi
on_term() { echo TERM >> "$FAKE_LOG/signals"; sleep 0.3; exit 75; }
trap on_term TERM
touch "$FAKE_LOG/started"
while :; do sleep 0.05; done
"""
FAKE_SCONTROL = '#!/bin/bash\necho "$@" >> "$FAKE_LOG/scontrol"\n'


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def slurm_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "prudent", FAKE_PRUDENT)
    log = tmp_path / "log"
    log.mkdir()
    system_path = os.pathsep.join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())
    assert not shutil.which("scontrol", path=system_path), "this machine has SLURM"
    return {"PATH": f"{bin_dir}{os.pathsep}{system_path}", "FAKE_LOG": str(log),
            "SLURM_JOB_ID": "4242", "HOME": str(tmp_path)}


def _start_slurm(env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    script = subprocess.Popen(["bash", str(SLURM), "--lr", "0.1"], cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    started = Path(env["FAKE_LOG"]) / "started"
    deadline = time.monotonic() + 10
    while not started.exists():
        assert script.poll() is None, script.communicate()
        assert time.monotonic() < deadline, "the script did not start prudent"
        time.sleep(0.01)
    return script


def _finish(script: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = script.communicate(timeout=10)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait()
    return script.returncode, err


def test_slurm_usr1_becomes_one_sigterm_and_exit_75_requeues(slurm_env: dict[str, str],
                                                              tmp_path: Path) -> None:
    _executable(Path(slurm_env["PATH"].split(os.pathsep)[0]) / "scontrol", FAKE_SCONTROL)
    script = _start_slurm(slurm_env, tmp_path)
    os.kill(script.pid, signal.SIGUSR1)  # --signal=B:USR1: the batch shell only
    time.sleep(0.1)
    os.kill(script.pid, signal.SIGUSR1)  # a second notice must not reach prudent again
    code, err = _finish(script)
    log = Path(slurm_env["FAKE_LOG"])
    assert code == 75, err
    assert (log / "signals").read_text() == "TERM\n"
    assert (log / "scontrol").read_text() == "requeue 4242\n"
    assert (log / "args").read_text() == \
        "run --run-id slurm-4242 --max-restarts 2 -- python train.py --lr 0.1\n"


def test_slurm_without_scontrol_exits_75_and_says_so(slurm_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    script = _start_slurm(slurm_env, tmp_path)
    os.kill(script.pid, signal.SIGTERM)  # a preemption's SIGTERM reaching the shell
    code, err = _finish(script)
    assert code == 75
    assert "preempted (exit 75); no scontrol here to requeue job 4242" in err


@pytest.mark.parametrize("exit_code", ["0", "1", "3"])
def test_slurm_passes_other_exit_codes_through_without_requeue(
        slurm_env: dict[str, str], tmp_path: Path, exit_code: str) -> None:
    _executable(Path(slurm_env["PATH"].split(os.pathsep)[0]) / "scontrol", FAKE_SCONTROL)
    result = subprocess.run(["bash", str(SLURM)], cwd=tmp_path, text=True, capture_output=True,
                            env={**slurm_env, "FAKE_EXIT": exit_code}, timeout=10)
    assert result.returncode == int(exit_code)
    assert not (Path(slurm_env["FAKE_LOG"]) / "scontrol").exists()


def test_slurm_script_outside_slurm_refuses_to_start(slurm_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    env = {k: v for k, v in slurm_env.items() if k != "SLURM_JOB_ID"}
    result = subprocess.run(["bash", str(SLURM)], cwd=tmp_path, env=env, text=True,
                            capture_output=True, timeout=10)
    assert result.returncode != 0 and "run this with sbatch" in result.stderr
    assert not (Path(slurm_env["FAKE_LOG"]) / "args").exists()
