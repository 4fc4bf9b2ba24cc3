"""How well the monitoring rules catch sick training, and what they cost.

Every scenario is a real training script from ``tests/e2e/scripts/monitor_*.py`` (tiny models
on generated data, CPU), run as its own process in a fresh project folder, twice:

* ``observe``  every rule's action set to ``alert`` (``stalled`` keeps ``stop``: a hung loop
  never ends otherwise), so each rule that would fire shows up: the detection matrix;
* ``default``  prudent's default rules and actions, as a user gets them: what actually stops
  the run, and the compute saved (planned steps not run, as a share of the planned steps).

Detection latency is the step a rule fired at (``detected_at``, when the monitor saw it)
minus the step the sickness began (``SCENARIO onset=`` printed by the script; for
overfitting, the step of the best validation loss). A false alarm is any rule firing on a
healthy run. ``--overhead`` adds the monitor's own cost per step: the time spent in its
handlers in a tight loop on the digits-sized MLP, and the paired step-time difference.

Reproduce::

    python benchmarks/monitor.py                 # all scenarios, 2 at a time, a few minutes
    python benchmarks/monitor.py --overhead      # and the per-step cost
    python benchmarks/monitor.py --only nan_batch high_lr --jobs 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import prudent
from prudent.monitor.registry import RULES
from prudent.store import Store

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "e2e" / "scripts"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "monitor.json"
HANG_YAML = {"stalled": {"timeout_s": 3, "grace_s": 2}}


@dataclass(frozen=True)
class Scenario:
    name: str
    intended: str | None  # None: healthy
    rules_yaml: dict[str, Any] = field(default_factory=dict)

    @property
    def script(self) -> Path:
        return SCRIPTS / f"monitor_{self.name}.py"


SCENARIOS = [
    Scenario("nan_batch", "non_finite"),
    Scenario("high_lr", "exploding_gradient"),
    Scenario("divergence", "divergence"),
    Scenario("deep_sigmoid", "vanishing_gradient"),
    Scenario("shuffled_labels", "loss_not_decreasing"),
    Scenario("tiny_lr", "update_ratio"),
    Scenario("dead_relu", "dead_activations"),
    Scenario("leak", "memory_growth"),
    Scenario("hang", "stalled", HANG_YAML),
    Scenario("overfit", "overfitting"),
    Scenario("healthy_mlp", None),
    Scenario("healthy_noisy", None),
    Scenario("healthy_spikes", None),
    Scenario("healthy_regression", None),
    Scenario("healthy_cnn", None),
]


@dataclass
class Outcome:
    scenario: str
    mode: str
    exit_code: int
    wall_s: float
    planned: int | None
    onset: int | None
    steps: int
    status: str
    stop_reason: str | None
    fired: dict[str, int]  # rule -> first detected_at
    messages: dict[str, str]


# running one scenario -----------------------------------------------------------------------
def settings_yaml(scenario: Scenario, mode: str) -> str:
    rules: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if mode == "observe":
        rules = {name: {"action": "alert", "cooldown_steps": 10**9} for name in RULES}
        rules["stalled"] = {}
        extra = {"checkpoint": {"enabled": False}}  # saves do not change what the rules see
    for name, values in scenario.rules_yaml.items():
        rules.setdefault(name, {}).update(values)
    return json.dumps({"monitor": {"rules": rules}, **extra})  # JSON is YAML


def run_scenario(scenario: Scenario, mode: str, timeout_s: float = 600) -> Outcome:
    with tempfile.TemporaryDirectory(prefix=f"prudent-monitor-{scenario.name}-") as tmp:
        project = Path(tmp)
        (project / "prudent.yaml").write_text(settings_yaml(scenario, mode))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
        env.update(PRUDENT_CONSOLE="plain", PRUDENT_RUN_ID=f"{scenario.name}-{mode}")
        started = time.perf_counter()
        result = subprocess.run([sys.executable, str(scenario.script)], cwd=project, env=env,
                                capture_output=True, text=True, timeout=timeout_s, check=False)
        wall = time.perf_counter() - started
        return read_outcome(scenario, mode, project, result, wall)


def read_outcome(scenario: Scenario, mode: str, project: Path,
                 result: subprocess.CompletedProcess[str], wall: float) -> Outcome:
    match = re.search(r"SCENARIO planned=(\d+) onset=(\w+)", result.stdout)
    if match is None:
        raise RuntimeError(f"{scenario.name} ({mode}) did not start:\n{result.stderr[-3000:]}")
    store = Store(f"sqlite:///{project / '.prudent' / 'prudent.db'}")
    try:
        run_id = f"{scenario.name}-{mode}"
        run = store.get_run(run_id) or {}
        fired: dict[str, int] = {}
        messages: dict[str, str] = {}
        for event in store.events(run_id):
            if event["kind"] == "rule" and event["name"] not in fired:
                fired[event["name"]] = int(event["payload"].get("detected_at", event["step"]))
                messages[event["name"]] = event["message"]
        onset = int(match.group(2)) if match.group(2).isdigit() else best_val_step(store, run_id)
    finally:
        store.close()
    return Outcome(scenario.name, mode, result.returncode, wall, int(match.group(1)), onset,
                   int(run.get("step") or 0), run.get("status", "?"), run.get("stop_reason"),
                   fired, messages)


def best_val_step(store: Store, run_id: str) -> int | None:
    series = [(step, value) for step, value in store.metric_series(run_id, "val_loss")
              if value is not None]
    return min(series, key=lambda sv: sv[1])[0] if series else None


# the report ---------------------------------------------------------------------------------
def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    observe = {o.scenario: o for o in outcomes if o.mode == "observe"}
    default = {o.scenario: o for o in outcomes if o.mode == "default"}
    rows, saved_planned, saved_steps = [], 0, 0
    for scenario in SCENARIOS:
        seen = observe.get(scenario.name)
        stopped = default.get(scenario.name)
        if seen is None:
            continue
        row: dict[str, Any] = {"scenario": scenario.name, "intended": scenario.intended,
                               "planned_steps": seen.planned, "onset": seen.onset,
                               "fired": seen.fired, "messages": seen.messages}
        if scenario.intended is not None:
            at = seen.fired.get(scenario.intended)
            row["caught"] = at is not None
            row["latency_steps"] = (at - seen.onset) if at is not None and seen.onset is not None else None
        if stopped is not None:
            row["default_mode"] = {"status": stopped.status, "stop_reason": stopped.stop_reason,
                                   "steps_run": stopped.steps, "exit_code": stopped.exit_code,
                                   "wall_s": round(stopped.wall_s, 2)}
            if scenario.intended is not None and stopped.planned:
                saved = max(0, stopped.planned - stopped.steps)
                row["compute_saved"] = saved / stopped.planned
                saved_planned += stopped.planned
                saved_steps += saved
        rows.append(row)
    healthy = [r for r in rows if r["intended"] is None]
    false_alarms = sum(len(r["fired"]) for r in healthy) + sum(
        len(default[r["scenario"]].fired) for r in healthy if r["scenario"] in default)
    sick = [r for r in rows if r["intended"] is not None]
    return {"rows": rows, "false_alarms": false_alarms,
            "caught": sum(bool(r.get("caught")) for r in sick), "sick": len(sick),
            "healthy": len(healthy),
            "compute_saved": saved_steps / saved_planned if saved_planned else None}


def print_report(summary: dict[str, Any], console: Console) -> None:
    rules = list(RULES)
    short = {name: name.replace("_", " ").replace("gradient", "grad") for name in rules}
    table = Table(title="detection matrix: step each rule fired at (observe mode); * intended",
                  show_lines=False)
    table.add_column("scenario", no_wrap=True)
    for name in rules:
        table.add_column(short[name], justify="right")
    table.add_column("latency", justify="right")
    table.add_column("default run", no_wrap=True)
    table.add_column("saved", justify="right")
    for row in summary["rows"]:
        cells = []
        for name in rules:
            at = row["fired"].get(name)
            text = "" if at is None else str(at)
            cells.append(f"{text}*" if name == row["intended"] else text)
        latency = row.get("latency_steps")
        default = row.get("default_mode", {})
        stop = f"{default.get('stop_reason') or default.get('status', '')} @ {default.get('steps_run', '')}"
        saved = row.get("compute_saved")
        table.add_row(row["scenario"], *cells, "" if latency is None else str(latency),
                      stop if default else "", "" if saved is None else f"{saved:.0%}")
    console.print(table)
    saved = summary["compute_saved"]
    console.print(f"caught {summary['caught']}/{summary['sick']} sick scenarios by their intended "
                  f"rule; false alarms on {summary['healthy']} healthy runs: "
                  f"{summary['false_alarms']}; compute saved on the sick runs: "
                  f"{'n/a' if saved is None else f'{saved:.0%}'} of the planned steps")


# overhead -------------------------------------------------------------------------------------
def measure_overhead(steps: int = 600, reps: int = 5) -> dict[str, Any]:
    """The monitor's cost per step next to the digits-sized MLP's step (64-128-128-10, batch
    32, AdamW, one thread), in CPU time of the training thread (``time.thread_time``), which a
    busy machine's other processes do not inflate:

    * the training loop with the kernel alone, and with the Monitor (default rules), paired and
      interleaved: the step time, the gradient-norm stride ``auto`` settles on, and the
      difference between the two (noisy: it is a small difference of large numbers);
    * the Monitor's per-step handlers alone in a tight loop over the same model's gradients,
      at that stride: the component's own cost per step, windows, rules and samples included.
    """
    torch.set_num_threads(1)
    with_monitor, without, strides = [], [], []
    for rep in range(reps + 1):
        for enabled in ((True, False) if rep % 2 else (False, True)):
            us, stride = _training_loop_us(steps, enabled)
            if rep:  # the first round warms up
                (with_monitor if enabled else without).append(us)
                strides += [stride] if enabled else []
    stride = int(statistics.median(strides))
    component = [_handlers_us(3000, stride) for _ in range(reps)]
    step_us = statistics.median(without)
    cost_us = statistics.median(component)
    return {"steps": steps, "reps": reps, "step_us": step_us,
            "step_us_with_monitor": statistics.median(with_monitor),
            "paired_delta_pct": 100 * statistics.median(
                (w - wo) / wo for w, wo in zip(with_monitor, without)),
            "grad_norm_every_steps": stride, "monitor_us_per_step": cost_us,
            "monitor_us_per_step_min": min(component),
            "monitor_pct_of_step": 100 * cost_us / step_us}


def _digits_sized() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _training_loop_us(steps: int, monitor_on: bool) -> tuple[float, int]:
    from torch.utils.data import DataLoader, TensorDataset

    from prudent.config import load_settings
    from prudent.monitor import Monitor

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(3200, 64, generator=generator),
                         torch.randint(0, 10, (3200,), generator=generator))
    loader = DataLoader(data, batch_size=32, shuffle=True, generator=generator)
    model, opt = _digits_sized()
    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(environ={"PRUDENT_HOME": home, "PRUDENT_CONSOLE": "off"})
        monitor = Monitor(settings.monitor, quiet=True)
        run = prudent.init(name="overhead", settings=settings, exit_on_stop=False,
                           components=[monitor] if monitor_on else [])
        run.attach(model=model, optimizer=opt)
        with run:
            started = time.thread_time()
            for _ in run.epochs(-(-steps // len(loader))):
                for x, y in run.batches(loader):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    run.backward(loss)
                    opt.step()
                    opt.zero_grad()
                    run.step(loss=loss)
            elapsed = time.thread_time() - started
        return 1e6 * elapsed / run.state.step, monitor.stats.norm_every


def _handlers_us(steps: int, stride: int) -> float:
    """CPU time of the Monitor's handlers per step, called as the run calls them."""
    from prudent.config import load_settings
    from prudent.monitor import Monitor, MonitorSettings

    model, opt = _digits_sized()
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(environ={"PRUDENT_HOME": home, "PRUDENT_CONSOLE": "off"})
        monitor = Monitor(MonitorSettings(grad_norm_every_steps=stride), quiet=True)
        run = prudent.init(name="handlers", settings=settings, exit_on_stop=False, components=[])
        run.attach(model=model, optimizer=opt)
        ctx = run.context  # what a component sees of the run
        monitor.on_attach(ctx, ctx.objects)
        metrics = {"loss": loss}
        with run:
            started = time.thread_time()
            for _ in range(steps):
                monitor.on_after_backward(ctx, loss)
                ctx.state.step += 1
                monitor.on_step_end(ctx, metrics)
            elapsed = time.thread_time() - started
        return 1e6 * elapsed / steps


# main -----------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios run at once")
    parser.add_argument("--modes", nargs="*", default=["observe", "default"])
    parser.add_argument("--overhead", action="store_true", help="also measure the cost per step")
    parser.add_argument("--overhead-only", action="store_true", help="only the cost per step")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    if args.overhead_only:
        chosen, args.overhead = [], True
    jobs = [(s, m) for m in args.modes for s in chosen if m == "observe" or s.intended]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(lambda job: run_scenario(*job), jobs))
    summary = summarise(outcomes)
    console = Console(width=max(Console().width, 160))
    print_report(summary, console)
    result: dict[str, Any] = {"benchmark": "monitor", "machine": machine(), **summary,
                              "runs": [asdict(o) for o in outcomes]}
    if args.overhead:
        result["overhead"] = measure_overhead()
        o = result["overhead"]
        console.print(f"overhead: the monitor costs {o['monitor_us_per_step']:.1f} us of CPU per step "
                      f"(min {o['monitor_us_per_step_min']:.1f}, gradient norm every "
                      f"{o['grad_norm_every_steps']} steps) = {o['monitor_pct_of_step']:.2f}% of the "
                      f"digits-sized step ({o['step_us']:.0f} us); paired training-loop difference "
                      f"{o['paired_delta_pct']:+.1f}%")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str))
    console.print(f"wrote {args.json}")


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "prudent": prudent.__version__, "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "load_avg": os.getloadavg()}


if __name__ == "__main__":
    main()
