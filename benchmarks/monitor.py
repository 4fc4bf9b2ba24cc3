"""How well the monitoring rules catch sick training, repair what can be repaired, and what
they cost.

Every scenario is a real training script from ``tests/e2e/scripts/monitor_*.py`` (tiny models
on generated data, CPU), run as its own process in a fresh project folder:

* ``observe``  sick scripts with every rule's action set to ``alert`` (``stalled`` keeps
  ``stop``: a hung loop never ends otherwise), so each rule that would fire shows up: the
  detection matrix (healthy scripts too, seed 0: what would fire on them);
* ``default``  prudent's default rules and actions, as a user gets them: what actually stops
  or repairs each sick run, and the compute saved (planned steps not run, as a share of the
  planned steps of the runs that were stopped, and as a share of their sick steps: those
  from the onset on, the most a stop can save); each healthy script over 3 seeds
  (``MONITOR_SEED``), which must never be stopped or rolled back;
* ``reference`` the repairable scripts with their sickness off (``MONITOR_HEALTHY=1``): a
  repaired run must end within 2% of its final validation loss.

Every checkpoint a default run writes is kept (``checkpoint.keep`` raised for the benchmark)
and loaded afterwards: none may hold a NaN or an infinity.

Detection latency is the step a rule fired at (observe: ``detected_at``; default: the step the
run stopped at) minus the step the sickness began (``SCENARIO onset=`` printed by the script;
for overfitting, the step of the best validation loss). ``--overhead`` adds the monitor's own
cost per step: the time spent in its handlers in a tight loop on the digits-sized MLP, and the
paired step-time difference.

Reproduce::

    python benchmarks/monitor.py                 # all scenarios, 2 at a time, ~10 minutes
    python benchmarks/monitor.py --overhead      # and the per-step cost
    python benchmarks/monitor.py --only nan_batch high_lr --jobs 1 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import math
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
from prudent.monitor.rules import BUILTIN_RULES  # registers them (the package exports lazily)
from prudent.store.database import Store

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "e2e" / "scripts"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "monitor.json"
HANG = {"monitor": {"rules": {"stalled": {"timeout_s": 3, "grace_s": 2}}}}
EVERY_50 = {"checkpoint": {"every": "50steps"}}  # rollback needs a checkpoint before the spike
REPAIR_TOLERANCE = 0.02
ACCURACY_TOLERANCE = 0.01  # a repaired burst ends within 1% of the untouched run's val_acc


@dataclass(frozen=True)
class Scenario:
    name: str
    intended: tuple[str, ...] | None  # the rules meant to catch it; None: healthy
    settings: dict[str, Any] = field(default_factory=dict)  # prudent.yaml, beyond the defaults
    repair: bool = False  # meant to be repaired (skip, rollback), not stopped
    script_name: str | None = None  # monitor_<name>.py unless one script plays several
    env: dict[str, str] = field(default_factory=dict)  # that script's variant
    file: str | None = None  # a script not named monitor_*.py

    @property
    def script(self) -> Path:
        return SCRIPTS / (self.file or f"monitor_{self.script_name or self.name}.py")


def burst(count: int, scale: int, at: str) -> Scenario:
    """A healthy run whose ``count`` batches in a row from step ``at`` (warmup: 50, inside
    loss_spike's warm-up of 67 steps; early: 100, middle: 300, late: 560 of 672) have their
    inputs scaled ``scale`` times: a bad shard, repairable (``burst_train.py``:
    ``monitor_burst_skip.py``'s run, logging val_acc as well)."""
    onset = {"warmup": 50, "early": 100, "middle": 300, "late": 560}[at]
    return Scenario(f"burst_{count}x{scale}_{at}", ("loss_spike", "exploding_gradient"),
                    repair=True, file="burst_train.py",
                    env={"BURST_LENGTH": str(count), "BURST_SCALE": str(scale),
                         "BURST_ONSET": str(onset)})


SCENARIOS = [
    Scenario("nan_batch", ("non_finite",)),
    Scenario("high_lr", ("exploding_gradient",)),
    Scenario("divergence", ("divergence",)),
    Scenario("deep_sigmoid", ("vanishing_gradient",)),
    Scenario("shuffled_labels", ("loss_not_decreasing",)),
    Scenario("tiny_lr", ("update_ratio",)),
    Scenario("dead_relu", ("dead_activations",)),
    Scenario("leak", ("memory_growth",)),
    Scenario("hang", ("stalled",), HANG),
    Scenario("overfit", ("overfitting", "early_stopping")),
    Scenario("random_labels", ("early_stopping", "overfitting", "loss_not_decreasing")),
    Scenario("leak_short", ("memory_growth",)),
    Scenario("spike_rollback", ("loss_spike",), EVERY_50, repair=True),
    Scenario("spike_skip", ("loss_spike",), repair=True),
    *(burst(count, scale, at) for count, scale in ((1, 50), (3, 10), (3, 50), (10, 50))
      for at in ("early", "middle", "late")),
    burst(1, 50, "warmup"), burst(3, 50, "warmup"),
    Scenario("late_nan", ("non_finite",)),
    Scenario("lr_zero", ("update_ratio",)),
    Scenario("healthy_mlp", None),
    Scenario("healthy_noisy", None),
    Scenario("healthy_spikes", None),
    Scenario("healthy_regression", None),
    Scenario("healthy_cnn", None),
    Scenario("healthy_restarts", None),
    Scenario("healthy_plateau", None),
    Scenario("healthy_clipped", None),
    Scenario("healthy_finetune", None),
    Scenario("healthy_sparse_eval", None),
    Scenario("healthy_shift", None),
    Scenario("healthy_solved", None),
]


@dataclass
class Outcome:
    scenario: str
    mode: str
    seed: int
    exit_code: int
    wall_s: float
    planned: int | None
    onset: int | None
    steps: int
    status: str
    stop_reason: str | None
    fired: dict[str, int]  # rule -> first detected_at
    messages: dict[str, str]
    rollbacks: int = 0
    skips: int = 0
    final_val_loss: float | None = None
    final_val_acc: float | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (step, rule) of each skip
    checkpoints: int = 0  # written and kept (all of them: keep is raised)
    bad_checkpoints: list[str] = field(default_factory=list)  # holding NaN/inf
    refused: int = 0  # saves not committed because a tensor was not finite


# running one scenario -----------------------------------------------------------------------
def settings_yaml(scenario: Scenario, mode: str) -> str:
    settings: dict[str, Any] = json.loads(json.dumps(scenario.settings))
    if mode == "observe":
        rules = {cls.name: {"action": "alert", "cooldown_steps": 10**9} for cls in BUILTIN_RULES}
        rules["stalled"] = {}
        for name, values in settings.get("monitor", {}).get("rules", {}).items():
            rules.setdefault(name, {}).update(values)
        settings.setdefault("monitor", {})["rules"] = rules
        settings["checkpoint"] = {"enabled": False}  # saves do not change what the rules see
    else:  # every checkpoint written stays, to be checked for NaN afterwards
        settings.setdefault("checkpoint", {})["keep"] = 100_000
    return json.dumps(settings)  # JSON is YAML


def run_scenario(scenario: Scenario, mode: str, seed: int = 0, timeout_s: float = 600) -> Outcome:
    with tempfile.TemporaryDirectory(prefix=f"prudent-monitor-{scenario.name}-") as tmp:
        project = Path(tmp)
        (project / "prudent.yaml").write_text(settings_yaml(scenario, mode))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PRUDENT_", "MONITOR_"))}
        run_id = f"{scenario.name}-{mode}-{seed}"
        env.update(PRUDENT_CONSOLE="plain", PRUDENT_RUN_ID=run_id, MONITOR_SEED=str(seed),
                   **scenario.env)
        if mode == "reference":
            env["MONITOR_HEALTHY"] = "1"
        started = time.perf_counter()
        result = subprocess.run([sys.executable, str(scenario.script)], cwd=project, env=env,
                                capture_output=True, text=True, timeout=timeout_s, check=False)
        wall = time.perf_counter() - started
        outcome = read_outcome(scenario, mode, seed, project, result, wall)
        outcome.checkpoints, outcome.bad_checkpoints = check_checkpoints(project)
        return outcome


def read_outcome(scenario: Scenario, mode: str, seed: int, project: Path,
                 result: subprocess.CompletedProcess[str], wall: float) -> Outcome:
    match = re.search(r"SCENARIO planned=(\d+) onset=(\w+)", result.stdout)
    if match is None:
        raise RuntimeError(f"{scenario.name} ({mode}) did not start:\n{result.stderr[-3000:]}")
    store = Store(f"sqlite:///{project / '.prudent' / 'prudent.db'}")
    try:
        run_id = f"{scenario.name}-{mode}-{seed}"
        run = store.get_run(run_id) or {}
        events = store.events(run_id)
        fired: dict[str, int] = {}
        messages: dict[str, str] = {}
        for event in events:
            if event["kind"] == "rule" and event["name"] not in fired:
                fired[event["name"]] = int(event["payload"].get("detected_at", event["step"]))
                messages[event["name"]] = event["message"]
        onset = int(match.group(2)) if match.group(2).isdigit() else best_val_step(store, run_id)
        losses = [v for _, v in store.metric_series(run_id, "val_loss") if v is not None]
        accuracies = [v for _, v in store.metric_series(run_id, "val_acc") if v is not None]
    finally:
        store.close()
    count = lambda kind, name: sum(e["kind"] == kind and e["name"] == name for e in events)  # noqa: E731
    return Outcome(scenario.name, mode, seed, result.returncode, wall, int(match.group(1)), onset,
                   int(run.get("step") or 0), run.get("status", "?"), run.get("stop_reason"),
                   fired, messages, rollbacks=count("monitor", "rollback"),
                   skips=count("monitor", "skipped_update"),
                   final_val_loss=losses[-1] if losses else None,
                   final_val_acc=accuracies[-1] if accuracies else None,
                   skipped=[(e["step"], e["payload"].get("rule", "?")) for e in events
                            if (e["kind"], e["name"]) == ("monitor", "skipped_update")],
                   refused=count("checkpoint", "not_finite"))


def check_checkpoints(project: Path) -> tuple[int, list[str]]:
    """Load every checkpoint the run kept; the ones holding a NaN or an infinity."""
    from prudent.checkpoint.finite import first_non_finite

    paths = sorted(project.glob(".prudent/runs/*/checkpoints/ckpt-*/state.pt"))
    bad = []
    for path in paths:
        payload = torch.load(path, weights_only=True, map_location="cpu")
        shards = path.parent.with_name(path.parent.name + ".shards")
        if shards.is_dir():  # the model and optimizer, as DCP shards beside the checkpoint
            payload["shards"] = _read_shards(shards)
        culprit = first_non_finite(payload)
        if culprit is not None:
            bad.append(f"{path.parent.name}: {culprit}")
    return len(paths), bad


def _read_shards(folder: Path) -> dict[str, Any]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(folder, Path(tmp) / "whole.pt")
        return torch.load(Path(tmp) / "whole.pt", weights_only=True, map_location="cpu")


def best_val_step(store: Store, run_id: str) -> int | None:
    series = [(step, value) for step, value in store.metric_series(run_id, "val_loss")
              if value is not None]
    return min(series, key=lambda sv: sv[1])[0] if series else None


# the report ---------------------------------------------------------------------------------
def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    by = {(o.scenario, o.mode, o.seed): o for o in outcomes}
    rows = [row for scenario in SCENARIOS
            if (row := scenario_row(scenario, by, outcomes)) is not None]
    sick = [r for r in rows if r["intended"] is not None]
    healthy = [r for r in rows if r["intended"] is None]
    stopped = [r for r in sick if r.get("verdict") == "stopped"]
    planned = sum(r["planned_steps"] for r in stopped)
    saved = sum(r["saved_steps"] for r in stopped)
    # the steps a stopped run would have run sick (from its onset on): the most a stop can
    # save, since a sickness cannot be stopped before it begins
    sick_steps = sum(r["planned_steps"] - r["onset"] for r in stopped if r["onset"] is not None)
    sick_saved = sum(r["saved_steps"] for r in stopped if r["onset"] is not None)
    return {
        "rows": rows, "sick": len(sick), "healthy": len(healthy),
        "caught": sum(bool(r.get("caught")) for r in sick),
        "stopped_or_repaired": sum(r.get("verdict") in ("stopped", "repaired") for r in sick),
        "compute_saved": saved / planned if planned else None,
        "sick_steps_saved": sick_saved / sick_steps if sick_steps else None,
        "healthy_runs": sum(len(r.get("seeds", [])) for r in healthy),
        "healthy_stops": sum(r.get("stops", 0) for r in healthy),
        "healthy_rollbacks": sum(r.get("rollbacks", 0) for r in healthy),
        "healthy_skips": sum(r.get("skips", 0) for r in healthy),
        "bursts": sum(r["scenario"].startswith("burst_") for r in sick),
        "bursts_first_skipped": sum(bool(r.get("first_skipped_by")) for r in sick
                                    if r["scenario"].startswith("burst_")),
        "false_alarms_observe": sum(len(r.get("fired", {})) for r in healthy),
        "checkpoints_checked": sum(o.checkpoints for o in outcomes),
        "bad_checkpoints": [b for o in outcomes for b in o.bad_checkpoints],
        "saves_refused_not_finite": sum(o.refused for o in outcomes),
    }


def scenario_row(scenario: Scenario, by: dict[tuple[str, str, int], Outcome],
                 outcomes: list[Outcome]) -> dict[str, Any] | None:
    seen = by.get((scenario.name, "observe", 0))
    default = by.get((scenario.name, "default", 0))
    if seen is None and default is None:
        return None
    any_run = seen or default
    row: dict[str, Any] = {"scenario": scenario.name, "intended": scenario.intended,
                           "planned_steps": any_run.planned, "onset": any_run.onset,  # type: ignore[union-attr]
                           "fired": seen.fired if seen else {},
                           "messages": seen.messages if seen else {}}
    if scenario.intended is None:
        runs = [o for o in outcomes if o.scenario == scenario.name and o.mode == "default"]
        row.update(seeds=[o.seed for o in runs], stops=sum(o.status != "completed" for o in runs),
                   rollbacks=sum(o.rollbacks for o in runs), skips=sum(o.skips for o in runs),
                   stop_reasons=[o.stop_reason for o in runs if o.stop_reason])
        return row
    if seen is not None:
        at = [seen.fired[r] for r in scenario.intended if r in seen.fired]
        # a repair is caught by what it did (a skipped update never fires the rule)
        row["caught"] = bool(at) or bool(default and scenario.repair and (
            default.rollbacks or default.skips))
        if at and seen.onset is not None:
            row["latency_steps"] = min(at) - seen.onset
    if default is not None:
        row.update(default_row(scenario, default, by.get((scenario.name, "reference", 0))))
    return row


def default_row(scenario: Scenario, run: Outcome, reference: Outcome | None) -> dict[str, Any]:
    row: dict[str, Any] = {"default_mode": {
        "status": run.status, "stop_reason": run.stop_reason, "steps_run": run.steps,
        "exit_code": run.exit_code, "wall_s": round(run.wall_s, 2), "rollbacks": run.rollbacks,
        "skips": run.skips, "final_val_loss": run.final_val_loss,
        "final_val_acc": run.final_val_acc, "skipped": run.skipped}}
    if run.onset is not None and scenario.repair:  # the first bad step's update, skipped?
        row["first_skipped_by"] = next((rule for step, rule in run.skipped
                                        if step == run.onset), None)
    planned = run.planned or 0
    # an early stop (early_stopping's finished training) ends the run completed, exit 0: a
    # stop all the same, with the steps it saved
    if run.status == "stopped" or (run.stop_reason or "").startswith("rule:"):
        row["verdict"] = "stopped"
        row["saved_steps"] = max(0, planned - run.steps)
        row["compute_saved"] = row["saved_steps"] / planned if planned else None
        if run.onset is not None:
            row["stop_latency_steps"] = run.steps - run.onset
            row["stop_latency_pct"] = 100 * (run.steps - run.onset) / planned if planned else None
    elif scenario.repair and reference is not None and run.final_val_loss is not None:
        ref = reference.final_val_loss
        gap = abs(run.final_val_loss - ref) / ref if ref else math.inf
        row["reference_val_loss"] = ref
        row["repair_gap"] = gap
        within = gap <= REPAIR_TOLERANCE
        if run.final_val_acc is not None and reference.final_val_acc:
            row["reference_val_acc"] = reference.final_val_acc
            row["accuracy_gap"] = abs(run.final_val_acc - reference.final_val_acc) / (
                reference.final_val_acc)
            within = row["accuracy_gap"] <= ACCURACY_TOLERANCE  # judged on accuracy, if logged
        row["verdict"] = "repaired" if within and (run.rollbacks or run.skips) else "not repaired"
    else:
        row["verdict"] = "completed (missed)"
    return row


def print_report(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="sick runs: the intended rule (observe mode), and what the defaults did")
    for name in ("scenario", "intended rule", "planned", "onset", "fired at (observe)",
                 "default run", "latency", "% of run", "saved"):
        table.add_column(name, justify="left" if name in ("scenario", "intended rule",
                                                          "default run") else "right")
    for row in summary["rows"]:
        if row["intended"] is None:
            continue
        at = [row["fired"][r] for r in row["intended"] if r in row["fired"]]
        default = row.get("default_mode", {})
        verdict = row.get("verdict", "")
        if verdict == "stopped":
            what = f"{default.get('stop_reason')} @ {default.get('steps_run')}"
        elif verdict:
            what = (f"{verdict}: {default.get('rollbacks')} rollback(s), {default.get('skips')} "
                    f"skip(s), val_loss {_num(default.get('final_val_loss'))} vs "
                    f"{_num(row.get('reference_val_loss'))}")
        else:
            what = ""
        pct = row.get("stop_latency_pct")
        saved = row.get("compute_saved")
        table.add_row(row["scenario"], " / ".join(row["intended"]), str(row["planned_steps"]),
                      str(row["onset"]), str(min(at)) if at else "-", what,
                      str(row.get("stop_latency_steps", "")),
                      "" if pct is None else f"{pct:.0f}%", "" if saved is None else f"{saved:.0%}")
    console.print(table)
    print_bursts(summary, console)
    healthy = Table(title="healthy runs: default rules, every seed")
    for name in ("scenario", "seeds", "stops", "rollbacks", "skipped updates",
                 "would fire (observe, seed 0)"):
        healthy.add_column(name)
    for row in summary["rows"]:
        if row["intended"] is None:
            healthy.add_row(row["scenario"], str(len(row.get("seeds", []))), str(row.get("stops")),
                            str(row.get("rollbacks")), str(row.get("skips")),
                            ", ".join(f"{k}@{v}" for k, v in row.get("fired", {}).items()))
    console.print(healthy)
    saved = summary["compute_saved"]
    console.print(
        f"sick: caught {summary['caught']}/{summary['sick']} by an intended rule, "
        f"{summary['stopped_or_repaired']}/{summary['sick']} stopped or repaired; compute saved "
        f"on the stopped runs: {_share(saved)} of their planned "
        f"steps, {_share(summary['sick_steps_saved'])} of their sick steps (from the onset "
        f"on). healthy: {summary['healthy_runs']} runs, {summary['healthy_stops']} stops, "
        f"{summary['healthy_rollbacks']} rollbacks, {summary['healthy_skips']} skipped updates. "
        f"checkpoints: {summary['checkpoints_checked']} loaded, "
        f"{len(summary['bad_checkpoints'])} non-finite; "
        f"{summary['saves_refused_not_finite']} saves refused for NaN/inf")


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def print_bursts(summary: dict[str, Any], console: Console) -> None:
    """The burst scenarios: what became of the run, its accuracy next to the untouched run's,
    and which rule skipped the first bad step's update (none: it was applied)."""
    table = Table(title="bursts of bad batches: default rules")
    for name in ("scenario", "onset", "verdict", "skips (step:rule)", "first bad step",
                 "val_acc", "untouched", "gap"):
        table.add_column(name)
    short = {"loss_spike": "ls", "exploding_gradient": "eg"}
    for row in summary["rows"]:
        if not row["scenario"].startswith("burst_"):
            continue
        default = row.get("default_mode", {})
        skipped = " ".join(f"{step}:{short.get(rule, rule)}" for step, rule in
                           default.get("skipped", []))
        gap = row.get("accuracy_gap")
        table.add_row(row["scenario"], str(row["onset"]), row.get("verdict", ""), skipped,
                      row.get("first_skipped_by") or "applied",
                      _num(default.get("final_val_acc")), _num(row.get("reference_val_acc")),
                      "" if gap is None else f"{gap:.2%}")
    console.print(table)
    console.print(f"first bad step of a burst skipped in {summary['bursts_first_skipped']} of "
                  f"{summary['bursts']} burst runs")


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


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

    from prudent.monitor import Monitor
    from prudent.wiring.config import load_settings

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
    from prudent.monitor import Monitor, MonitorSettings
    from prudent.wiring.config import load_settings

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
    parser.add_argument("--seeds", type=int, default=3, help="seeds per healthy scenario")
    parser.add_argument("--overhead", action="store_true", help="also measure the cost per step")
    parser.add_argument("--overhead-only", action="store_true", help="only the cost per step")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    if args.overhead_only:
        chosen, args.overhead = [], True
    jobs = plan(chosen, args.seeds)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(lambda job: run_scenario(*job), jobs))
    summary = summarise(outcomes)
    console = Console(width=max(Console().width, 160))
    print_report(summary, console)
    console.print(f"{len(jobs)} runs in {time.perf_counter() - started:.0f} s")
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


def plan(chosen: list[Scenario], seeds: int) -> list[tuple[Scenario, str, int]]:
    """The runs: the longest first, so two workers finish together."""
    jobs: list[tuple[Scenario, str, int]] = []
    for scenario in chosen:
        jobs.append((scenario, "observe", 0))
        if scenario.intended is None:
            jobs += [(scenario, "default", seed) for seed in range(seeds)]
        else:
            jobs.append((scenario, "default", 0))
            if scenario.repair:
                jobs.append((scenario, "reference", 0))
    return sorted(jobs, key=lambda job: job[0].name in ("hang",) or job[0].intended is not None)


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "prudent": prudent.__version__, "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "load_avg": os.getloadavg()}


if __name__ == "__main__":
    main()
