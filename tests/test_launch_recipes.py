"""The launch recipes in examples/launch/: every file parses, says what docs/launch.md (one node) or
docs/many-gpus.md (several nodes) says, uses prudent's exit codes and setting variables, the
multi-node ones meet in one rendezvous keyed by the job, and the SLURM scripts turn SLURM's
SIGUSR1 into a SIGTERM for the training and requeue on exit 75.

The SLURM scripts run here with stand-ins for ``prudent``, ``srun``, ``scontrol`` and
``scancel`` on the PATH (``prudent`` a shell script that waits for SIGTERM), so their signal
and exit-code handling is tested in a second; tests/e2e/test_launch_recipes.py replays each
platform's signals against a real training run.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from prudent.kernel.stop import ExitCode
from prudent.launch import spec as launch
from prudent.launch.spec import ENV_SETTINGS

ROOT = Path(__file__).parents[1]
LAUNCH = ROOT / "examples" / "launch"
SKYPILOT = LAUNCH / "skypilot.yaml"
SLURM = LAUNCH / "slurm.sbatch"
KUBERNETES = LAUNCH / "kubernetes.yaml"
SAGEMAKER = LAUNCH / "sagemaker" / "launch.py"
SAGEMAKER_ENTRY = LAUNCH / "sagemaker" / "entry.sh"
SLURM_MULTINODE = LAUNCH / "slurm-multinode.sbatch"
SKYPILOT_MULTINODE = LAUNCH / "skypilot-multinode.yaml"
KUBERNETES_MULTINODE = LAUNCH / "kubernetes-multinode.yaml"
MULTINODE = (SLURM_MULTINODE, SKYPILOT_MULTINODE, KUBERNETES_MULTINODE)
LAUNCH_PAGE = ROOT / "docs" / "launch.md"
SECTION = "# Launching in the cloud"
MANY_GPUS = ROOT / "docs" / "many-gpus.md"
MANY_GPUS_SECTION = "## Recipes"
# what a platform must do with each of prudent's codes: resume, or give up at once
RESUMABLE = [int(ExitCode.PREEMPTED)]
HOPELESS = sorted(int(c) for c in (ExitCode.BAD_INPUT, ExitCode.RULE, ExitCode.BUDGET,
                                   ExitCode.PRUNED, ExitCode.POLICY))


# extracting the command lines -------------------------------------------------------------
def shell_commands(text: str) -> list[str]:
    """The ``prudent run ...`` command lines of a shell script (continued lines joined), from
    ``prudent run`` on: less a leading ``exec`` or ``srun [options]`` and a trailing ``&``."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        line = " ".join(line.split()).removesuffix(" &")
        start = line.find("prudent run ")
        before = line[:start]
        if start < 0 or not (before in ("", "exec ") or before.startswith("srun ")):
            continue
        found.append(line[start:])
    return found


def job_of(path: Path) -> dict[str, Any]:
    """A Kubernetes recipe's Job (a file may also hold its Service)."""
    return next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Job")


def kubernetes_commands(job: dict[str, Any]) -> list[str]:
    containers = job["spec"]["template"]["spec"]["containers"]
    return [" ".join(c.get("command", []) + c.get("args", [])) for c in containers]


def recipe_commands(path: Path) -> list[str]:
    """The ``prudent run`` command lines a recipe file launches."""
    if path in (KUBERNETES, KUBERNETES_MULTINODE):
        return kubernetes_commands(job_of(path))
    if path in (SKYPILOT, SKYPILOT_MULTINODE):
        return shell_commands(yaml.safe_load(path.read_text())["run"])
    if path.suffix == ".py":
        return []  # the estimator: its entry point (entry.sh) holds the command
    return shell_commands(path.read_text())


def section(path: Path, title: str) -> str:
    text = path.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end >= 0 else None]


def launch_section() -> str:
    return section(LAUNCH_PAGE, SECTION)


def documented_recipes(text: str) -> dict[str, tuple[list[Path], list[str]]]:
    """Each ``###`` recipe of a documentation section: the files it links and the command
    lines in its code blocks (a ``command: [...]`` line is a Kubernetes container's command)."""
    recipes = {}
    for block in text.split("\n### ")[1:]:
        title = block.splitlines()[0]
        links = [ROOT / p for p in dict.fromkeys(
            re.findall(r"\((?:\.\./)?(examples/launch/[^)]+)\)", block))]
        code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", block, flags=re.S))
        commands = shell_commands(code)
        for line in code.splitlines():
            if line.startswith("command:"):
                commands.append(" ".join(yaml.safe_load(line)["command"]))
        recipes[title] = (links, commands)
    return recipes


def launch_recipes() -> dict[str, tuple[list[Path], list[str]]]:
    return documented_recipes(launch_section())


def many_gpus_recipes() -> dict[str, tuple[list[Path], list[str]]]:
    return documented_recipes(section(MANY_GPUS, MANY_GPUS_SECTION))


def options(argv: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line (a flag without a value maps to "")."""
    found = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            found[arg] = "" if nxt.startswith("--") else nxt
    return found


def prudent_and_torchrun(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The options of a multi-node recipe's ``prudent run`` and of the torchrun it starts."""
    [command] = recipe_commands(path)
    argv = command.split() if path == KUBERNETES_MULTINODE else shlex.split(command)
    cut = argv.index("--")
    assert argv[cut + 1] == "torchrun", command
    return options(argv[:cut]), options(argv[cut + 1:])


# every file parses --------------------------------------------------------------------------
def test_every_recipe_file_is_linked_from_the_launch_or_the_many_gpus_page() -> None:
    one_node = {p for links, _ in launch_recipes().values() for p in links}
    many = {p for links, _ in many_gpus_recipes().values() for p in links}
    files = {p for p in LAUNCH.rglob("*") if p.is_file() and p.name != "requirements.txt"}
    assert one_node | many == files
    assert many == set(MULTINODE) and not one_node & many
    assert len(launch_recipes()) == 4 and len(many_gpus_recipes()) == 3
    assert "(many-gpus.md)" in launch_section()


def test_skypilot_task_resumes_by_task_id_and_leaves_relaunching_to_skypilot() -> None:
    task = yaml.safe_load(SKYPILOT.read_text())
    assert task["resources"]["use_spot"] is True
    assert 75 in task["resources"]["job_recovery"]["recover_on_exit_codes"]
    assert task["envs"]["CHECKPOINT_ROOT"].startswith("s3://")
    assert 'PRUDENT_CHECKPOINT_URL="${CHECKPOINT_ROOT}/${SKYPILOT_TASK_ID}"' in task["run"]
    [command] = recipe_commands(SKYPILOT)
    assert '--run-id "${SKYPILOT_TASK_ID}" --max-restarts 2 --' in command  # crashes: here
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


# several nodes: one rendezvous keyed by the job, the record and checkpoints shared -----------
JOB_IDENTITY = {SLURM_MULTINODE: "SLURM_JOB_ID", SKYPILOT_MULTINODE: "SKYPILOT_TASK_ID",
                KUBERNETES_MULTINODE: "JOB_NAME"}
NODE_COUNT = {SLURM_MULTINODE: "SLURM_NNODES", SKYPILOT_MULTINODE: "SKYPILOT_NUM_NODES",
              KUBERNETES_MULTINODE: "NUM_NODES"}


def variables(value: str) -> set[str]:
    """The variables a shell (``$X``, ``${X}``) or Kubernetes (``$(X)``) value reads."""
    return {a or b for a, b in re.findall(r"\$\{?([A-Za-z_]\w*)\}?|\$\((\w+)\)", value)}


@pytest.mark.parametrize("path", MULTINODE, ids=lambda p: p.name)
def test_multinode_recipes_meet_in_one_rendezvous_keyed_by_the_job(path: Path) -> None:
    prudent, torchrun = prudent_and_torchrun(path)
    assert prudent["--max-restarts"] == "0"  # one node relaunching alone would meet nobody
    job = {JOB_IDENTITY[path]}
    assert variables(prudent["--run-id"]) == job  # every node names the same run ...
    assert variables(torchrun["--rdzv-id"]) == job  # ... and joins the same rendezvous
    assert torchrun["--rdzv-backend"] == "c10d"
    assert "--standalone" not in torchrun and "--node-rank" not in torchrun
    assert variables(torchrun["--nnodes"]) == {NODE_COUNT[path]}
    host, port = torchrun["--rdzv-endpoint"].rsplit(":", 1)
    assert host and port


def test_slurm_multinode_script_starts_one_prudent_run_per_node_on_the_first_node() -> None:
    text = SLURM_MULTINODE.read_text()
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", text, flags=re.M))
    assert int(sbatch["nodes"]) > 1 and sbatch["ntasks-per-node"] == "1"
    assert sbatch["signal"] == "B:USR1@120" and "requeue" in sbatch
    assert subprocess.run(["bash", "-n", str(SLURM_MULTINODE)]).returncode == 0
    srun = next(line for line in text.replace("\\\n", " ").splitlines()
                if line.strip().startswith("srun "))
    assert {"--ntasks-per-node=1", "--kill-on-bad-exit=0", "--wait=0"} <= set(srun.split())
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert 'gpus_per_node="${SLURM_GPUS_ON_NODE:-1}"' in text
    _, torchrun = prudent_and_torchrun(SLURM_MULTINODE)
    assert torchrun["--nproc-per-node"] == "$gpus_per_node"
    assert torchrun["--rdzv-endpoint"] == "${head_node}:${rdzv_port}"


def test_skypilot_multinode_task_shares_the_store_and_the_bucket() -> None:
    task = yaml.safe_load(SKYPILOT_MULTINODE.read_text())
    assert task["num_nodes"] > 1
    assert task["resources"]["use_spot"] is True
    assert "PRUDENT_STORE_URL" in task["secrets"]  # a password: a secret, not an env
    assert task["envs"]["CHECKPOINT_ROOT"].startswith("s3://")
    assert 'PRUDENT_CHECKPOINT_URL="${CHECKPOINT_ROOT}/${SKYPILOT_TASK_ID}"' in task["run"]
    assert 'head_node=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)' in task["run"]
    _, torchrun = prudent_and_torchrun(SKYPILOT_MULTINODE)
    assert torchrun["--nproc-per-node"] == "$SKYPILOT_NUM_GPUS_PER_NODE"
    assert torchrun["--rdzv-endpoint"] == "${head_node}:${RDZV_PORT}"
    assert "RDZV_PORT" in task["envs"]
    for block in ("setup", "run"):
        assert subprocess.run(["bash", "-n"], input=task[block], text=True).returncode == 0


def test_kubernetes_multinode_job_is_indexed_behind_a_headless_service() -> None:
    service, job = yaml.safe_load_all(KUBERNETES_MULTINODE.read_text())
    assert (service["kind"], job["kind"], job["spec"]["completionMode"]) == \
        ("Service", "Job", "Indexed")
    name = job["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    assert service["spec"]["clusterIP"] == "None"  # headless: a DNS name per pod
    assert service["metadata"]["name"] == pod["subdomain"] == name  # $(JOB_NAME) names both
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    nodes = int(env["NUM_NODES"]["value"])
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nodes > 1
    assert int(env["GPUS_PER_NODE"]["value"]) == container["resources"]["limits"]["nvidia.com/gpu"]
    _, torchrun = prudent_and_torchrun(KUBERNETES_MULTINODE)
    assert torchrun["--nproc-per-node"] == "$(GPUS_PER_NODE)"
    host, port = torchrun["--rdzv-endpoint"].rsplit(":", 1)
    assert host == "$(JOB_NAME)-0.$(JOB_NAME)"  # pod 0 of the Job, by its name under the Service
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    assert int(port) in [p["containerPort"] for p in container["ports"]]
    assert pod["restartPolicy"] == "Never"
    assert env["PRUDENT_STORE_URL"]["valueFrom"]["secretKeyRef"]
    assert env["CHECKPOINT_ROOT"]["value"].startswith("s3://")
    assert env["PRUDENT_CHECKPOINT_URL"]["value"] == "$(CHECKPOINT_ROOT)/$(JOB_NAME)"
    assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"]) < \
        pod["terminationGracePeriodSeconds"]  # torchrun's wait for the save ends before the kill


# every recipe: prudent's exit codes and setting variables -----------------------------------
@pytest.mark.parametrize("path", [SKYPILOT, SKYPILOT_MULTINODE], ids=lambda p: p.name)
def test_skypilot_recovers_on_exactly_the_resumable_code(path: Path) -> None:
    task = yaml.safe_load(path.read_text())
    assert task["resources"]["job_recovery"]["recover_on_exit_codes"] == RESUMABLE


@pytest.mark.parametrize("path", [SKYPILOT, SKYPILOT_MULTINODE], ids=lambda p: p.name)
def test_skypilot_never_relaunches_what_prudent_ended_for_good(path: Path) -> None:
    """Exit 2-6 (bad input, a rule, a budget, pruned, the policy) would stop a new VM again:
    SkyPilot retries no error, and crashes are relaunched in place (prudent run's or
    torchrun's own --max-restarts)."""
    task = yaml.safe_load(path.read_text())
    assert task["resources"]["job_recovery"]["max_restarts_on_errors"] == 0
    [command] = recipe_commands(path)
    assert re.search(r"--max-restarts [1-9]", command.split("torchrun")[-1]), command


@pytest.mark.parametrize("path", [KUBERNETES, KUBERNETES_MULTINODE], ids=lambda p: p.name)
def test_kubernetes_ignores_the_resumable_code_and_fails_at_once_on_the_hopeless(
        path: Path) -> None:
    rules = job_of(path)["spec"]["podFailurePolicy"]["rules"]
    by_action: dict[str, list[int]] = {}
    for rule in rules:
        if "onExitCodes" in rule:
            assert rule["onExitCodes"]["operator"] == "In"
            assert rule["onExitCodes"]["containerName"] == "train"
            by_action.setdefault(rule["action"], []).extend(rule["onExitCodes"]["values"])
    assert by_action == {"Ignore": RESUMABLE, "FailJob": HOPELESS}
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules


@pytest.mark.parametrize("path", [SLURM, SLURM_MULTINODE], ids=lambda p: p.name)
def test_slurm_requeues_on_exactly_the_resumable_code(path: Path) -> None:
    requeue_on = re.findall(r'if \[ "\$code" -eq (\d+) \]; then\n(?:.*\n){0,1}\s*scontrol requeue',
                            path.read_text())
    assert [int(c) for c in requeue_on] == RESUMABLE


def test_slurm_multinode_relaunches_on_exactly_a_crash() -> None:
    relaunch_unless = re.findall(r'if \[ "\$code" -ne (\d+) \]', SLURM_MULTINODE.read_text())
    assert [int(c) for c in relaunch_unless] == [int(ExitCode.ERROR)]


def test_recipes_name_prudents_settings_by_their_variables() -> None:
    known = set(ENV_SETTINGS) | {value for name, value in vars(launch).items()
                                 if name.startswith("ENV_") and isinstance(value, str)}
    used = {var for path in LAUNCH.rglob("*") if path.is_file()
            for var in re.findall(r"\bPRUDENT_[A-Z_]+", path.read_text())}
    assert used <= known, used - known
    assert ENV_SETTINGS["PRUDENT_CHECKPOINT_URL"] == ("checkpoint", "url")
    assert ENV_SETTINGS["PRUDENT_STORE_URL"] == ("store", "url")
    assert {"PRUDENT_CHECKPOINT_URL", "PRUDENT_STORE_URL"} <= used


# the docs say what the files do --------------------------------------------------------
@pytest.mark.parametrize("recipes", [launch_recipes, many_gpus_recipes])
def test_documented_command_lines_are_exactly_those_of_the_recipes(recipes: Any) -> None:
    for title, (links, documented) in recipes().items():
        in_files = [c for path in links for c in recipe_commands(path)]
        assert in_files, f"{title}: the linked files launch no prudent run"
        assert documented == in_files, title


# the SLURM script's signal handling, with a stand-in prudent ----------------------------
# its files end in the node's number under the stand-in srun (SLURM_NODEID)
FAKE_PRUDENT = """#!/bin/bash
node="${SLURM_NODEID:-}"
echo "$@" > "$FAKE_LOG/args$node"
if [ -n "${FAKE_EXIT:-}" ]; then exit "$FAKE_EXIT"; fi
on_term() { echo TERM >> "$FAKE_LOG/signals$node"; sleep 0.3; exit 75; }
trap on_term TERM
touch "$FAKE_LOG/started$node"
while :; do sleep 0.05; done
"""
FAKE_SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then printf '%s\\n' ${FAKE_HOSTS:-node-a node-b}; exit 0; fi
echo "$@" >> "$FAKE_LOG/scontrol"
"""
# srun [--option=value ...] command: one task per node, each task's pid in FAKE_LOG/tasks; exits
# with the highest of the tasks' codes, as srun does
FAKE_SRUN = """#!/bin/bash
echo "$@" >> "$FAKE_LOG/srun"
while [ "${1#--}" != "$1" ]; do shift; done
pids=""
for node in $(seq 0 $((${SLURM_NNODES:-1} - 1))); do
    SLURM_NODEID=$node SLURM_PROCID=$node "$@" &
    pids="$pids $!"
    echo $! >> "$FAKE_LOG/tasks"
done
code=0
for pid in $pids; do
    wait "$pid"
    status=$?
    [ "$status" -gt "$code" ] && code=$status
done
exit "$code"
"""
# scancel --signal=SIG JOB: SIG to every process of the job's steps, as slurmstepd sends it to
# the step's whole process tree (the batch script is not a step's)
FAKE_SCANCEL = f"""#!{sys.executable}
import os, signal, sys, time
import psutil
log = os.environ["FAKE_LOG"]
with open(os.path.join(log, "scancel"), "a") as out:
    out.write(" ".join(sys.argv[1:]) + "\\n")
name = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--signal="))
signum = getattr(signal, "SIG" + name)
tasks, deadline = [], time.monotonic() + 10
while len(tasks) < int(os.environ.get("SLURM_NNODES", "1")) and time.monotonic() < deadline:
    time.sleep(0.01)
    path = os.path.join(log, "tasks")
    tasks = open(path).read().split() if os.path.exists(path) else []
for pid in tasks:
    try:
        tree = [psutil.Process(int(pid)), *psutil.Process(int(pid)).children(recursive=True)]
    except psutil.NoSuchProcess:
        continue
    for process in tree:
        try:
            process.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
"""


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


def _start_slurm(env: dict[str, str], cwd: Path, path: Path = SLURM,
                 nodes: tuple[str, ...] = ("",)) -> subprocess.Popen[str]:
    """The batch script, once the stand-in prudent started (on each of ``nodes``)."""
    script = subprocess.Popen(["bash", str(path), "--lr", "0.1"], cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    started = [Path(env["FAKE_LOG"]) / f"started{node}" for node in nodes]
    deadline = time.monotonic() + 10
    while not all(path.exists() for path in started):
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


# the multi-node SLURM script, with stand-ins for srun, scontrol and scancel -------------------
@pytest.fixture
def slurm_nodes_env(slurm_env: dict[str, str]) -> dict[str, str]:
    bin_dir = Path(slurm_env["PATH"].split(os.pathsep)[0])
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                       ("scancel", FAKE_SCANCEL)):
        _executable(bin_dir / name, text)
    return {**slurm_env, "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node-[a-b]",
            "SLURM_GPUS_ON_NODE": "4", "PRUDENT_STORE_URL": "postgresql://db.example/prudent"}


NODE_ARGS = ("run --run-id slurm-4242 --max-restarts 0 -- torchrun --nnodes 2 --nproc-per-node 4 "
             "--rdzv-backend c10d --rdzv-endpoint node-a:29500 --rdzv-id 4242 train.py --lr 0.1\n")


def test_slurm_multinode_usr1_stops_every_node_once_and_exit_75_requeues(
        slurm_nodes_env: dict[str, str], tmp_path: Path) -> None:
    script = _start_slurm(slurm_nodes_env, tmp_path, SLURM_MULTINODE, nodes=("0", "1"))
    os.kill(script.pid, signal.SIGUSR1)  # --signal=B:USR1: the batch shell only
    time.sleep(0.1)
    os.kill(script.pid, signal.SIGUSR1)  # a second notice must not reach the nodes again
    code, err = _finish(script)
    log = Path(slurm_nodes_env["FAKE_LOG"])
    assert code == 75, err
    assert (log / "scancel").read_text() == "--signal=TERM 4242\n"
    for node in ("0", "1"):
        assert (log / f"signals{node}").read_text() == "TERM\n"
        assert (log / f"args{node}").read_text() == NODE_ARGS
    assert (log / "scontrol").read_text() == "requeue 4242\n"
    [srun] = (log / "srun").read_text().splitlines()
    assert srun.startswith("--ntasks-per-node=1 --kill-on-bad-exit=0 --wait=0 prudent run ")


def test_slurm_multinode_crash_relaunches_every_node_twice_then_exits_1(
        slurm_nodes_env: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(SLURM_MULTINODE)], cwd=tmp_path, text=True,
                            capture_output=True, env={**slurm_nodes_env, "FAKE_EXIT": "1"},
                            timeout=20)
    log = Path(slurm_nodes_env["FAKE_LOG"])
    assert result.returncode == 1
    assert len((log / "srun").read_text().splitlines()) == 3
    assert "relaunching it on every node (2 of 2)" in result.stderr
    assert not (log / "scontrol").exists()


@pytest.mark.parametrize("exit_code", ["0", "3", "4"])
def test_slurm_multinode_passes_other_exit_codes_through_once_without_requeue(
        slurm_nodes_env: dict[str, str], tmp_path: Path, exit_code: str) -> None:
    result = subprocess.run(["bash", str(SLURM_MULTINODE)], cwd=tmp_path, text=True,
                            capture_output=True, env={**slurm_nodes_env, "FAKE_EXIT": exit_code},
                            timeout=20)
    log = Path(slurm_nodes_env["FAKE_LOG"])
    assert result.returncode == int(exit_code), result.stderr
    assert len((log / "srun").read_text().splitlines()) == 1
    assert not (log / "scontrol").exists()


def test_slurm_multinode_without_a_shared_store_refuses_to_start(
        slurm_nodes_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in slurm_nodes_env.items() if k != "PRUDENT_STORE_URL"}
    result = subprocess.run(["bash", str(SLURM_MULTINODE)], cwd=tmp_path, env=env, text=True,
                            capture_output=True, timeout=10)
    assert result.returncode != 0 and "PRUDENT_STORE_URL" in result.stderr
    assert not (Path(slurm_nodes_env["FAKE_LOG"]) / "srun").exists()
