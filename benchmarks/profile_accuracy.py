"""How true is the profiler's breakdown, and what does it cost a step?

Accuracy: three runs with known delays (sleeps) in the loader, in the step, in evaluation and
in a stand-in checkpoint component (a sleep, then ``CHECKPOINT_SAVED``, as prudent's own
Checkpointer does after a synchronous save). Each delay is also timed independently with
``time.perf_counter`` around it ("truth"; sleeps overshoot their nominal length a little).
The profiler's seconds per category must be within 5% of the truth.

Overhead: (1) the Profiler's own cost per step, from a tight loop of ``run.batches`` and
``run.step`` with the Profiler as the only component versus none; (2) the digits example's
median step time with profiling on and off (defaults otherwise, checkpoints off so that their
saves do not dilute the figure), in one run whose epochs alternate on and off, so that the
load of a shared machine, which drifts over seconds, falls on both arms alike.

    python benchmarks/profile_accuracy.py            # about a minute on two CPU cores
    python benchmarks/profile_accuracy.py --json /tmp/p.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import prudent
from prudent.kernel.context import RunContext
from prudent.kernel.events import Component, Event
from prudent.profile import Profiler, ProfileSettings
from prudent.testing import make_settings
from prudent.wiring.components import default_components

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "profile_accuracy.json"
TOLERANCE = 0.05
clock = time.perf_counter

SCENARIOS: dict[str, dict[str, Any]] = {
    "input-bound": {"steps": 200, "data_s": 0.010, "compute_s": 0.005},
    "compute-bound": {"steps": 100, "data_s": 0.002, "compute_s": 0.020},
    "eval+checkpoint": {"steps": 200, "data_s": 0.005, "compute_s": 0.005, "eval_s": 0.100,
                        "eval_every": 20, "checkpoint_s": 0.030, "checkpoint_every": 10},
}


class Truth:
    """Independent stopwatches around each injected delay."""

    def __init__(self) -> None:
        self.seconds = {"data": 0.0, "compute": 0.0, "checkpoint": 0.0, "eval": 0.0}
        self.nominal = dict(self.seconds)

    @contextlib.contextmanager
    def timing(self, category: str, nominal_s: float = 0.0) -> Iterator[None]:
        start = clock()
        yield
        self.seconds[category] += clock() - start
        self.nominal[category] += nominal_s


class SleepyCheckpoint(Component):
    """Stands in for a synchronous checkpoint save of known cost, after the profiler."""

    name = "sleepy_checkpoint"

    def __init__(self, truth: Truth, every: int, cost_s: float) -> None:
        self.truth, self.every, self.cost_s = truth, every, cost_s

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        if self.every and run.state.step % self.every == 0:
            with self.truth.timing("checkpoint", self.cost_s):
                time.sleep(self.cost_s)
            run.emit(Event.CHECKPOINT_SAVED, f"step-{run.state.step}")


def slow_loader(truth: Truth, steps: int, delay_s: float) -> Iterator[torch.Tensor]:
    for _ in range(steps):
        with truth.timing("data", delay_s):
            time.sleep(delay_s)
            batch = torch.randn(32, 16)
        yield batch


def run_scenario(home: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    truth = Truth()
    settings = make_settings(home, profile={"interval_s": 1.0}, checkpoint={"enabled": False})
    checkpoint = SleepyCheckpoint(truth, spec.get("checkpoint_every", 0),
                                  spec.get("checkpoint_s", 0.0))
    run = prudent.init(name=name, settings=settings, exit_on_stop=False,
                       components=[*default_components(settings), checkpoint])
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(1):
            for x in run.batches(slow_loader(truth, spec["steps"], spec["data_s"])):
                with truth.timing("compute", spec["compute_s"]):
                    loss = F.mse_loss(model(x), torch.zeros(32, 2))
                    run.backward(loss)
                    opt.step()
                    opt.zero_grad()
                    time.sleep(spec["compute_s"])  # stands in for device time
                run.step(loss=loss)
                if spec.get("eval_every") and run.state.step % spec["eval_every"] == 0:
                    with truth.timing("eval", spec["eval_s"]):
                        time.sleep(spec["eval_s"])
                    run.log(val=0.0)
    profiler = next(c for c in run.context.components if isinstance(c, Profiler))
    assert profiler.summary is not None
    measured = {k: v["s"] for k, v in profiler.summary["breakdown"].items()}
    return {"scenario": name, "spec": spec, "truth_s": truth.seconds, "nominal_s": truth.nominal,
            "measured_s": measured, "findings": [f["id"] for f in profiler.summary["findings"]]}


def errors(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    out = {}
    for category, truth in result["truth_s"].items():
        if truth > 0:
            measured, nominal = result["measured_s"][category], result["nominal_s"][category]
            out[category] = {"vs_truth": measured / truth - 1, "vs_nominal": measured / nominal - 1}
    return out


# overhead ----------------------------------------------------------------------------------
def tight_loop_us(home: str, with_profiler: bool, steps: int) -> float:
    """Wall time per step of run.batches + run.step with no other work, in microseconds."""
    settings = make_settings(home)
    components = [Profiler(ProfileSettings(interval_s=5.0), quiet=True)] if with_profiler else []
    run = prudent.init(name="tight", settings=settings, exit_on_stop=False, components=components)
    batch = torch.zeros(8, 4)
    with run:
        start = clock()
        for _ in run.epochs(1):
            for _x in run.batches([batch] * steps):
                run.step()
        elapsed = clock() - start
    return 1e6 * elapsed / steps


def component_overhead(home: str, reps: int, steps: int) -> dict[str, Any]:
    tight_loop_us(home, True, 2000)  # warm-up
    pairs = []
    for rep in range(reps):
        order = (True, False) if rep % 2 else (False, True)
        timing = {arm: tight_loop_us(home, arm, steps) for arm in order}
        pairs.append((timing[False], timing[True]))
    return {"bare_us": statistics.median(p[0] for p in pairs),
            "with_profiler_us": statistics.median(p[1] for p in pairs),
            "profiler_us_per_step": statistics.median(p[1] - p[0] for p in pairs),
            "pairs": pairs}


def digits_step_times(home: str, epochs: int,
                      unplug: bool = True) -> dict[str, list[tuple[float, float]]]:
    """Per-step (wall, training-thread CPU) seconds of digits, the Profiler on in even epochs.

    One run, the Profiler's handlers unplugged in odd epochs (a benchmark may reach into the
    kernel; components may not): epochs of ~0.1 s interleave finely enough that a shared
    machine's load, which drifts over seconds, falls on both arms alike. ``unplug=False`` is
    the A/A control: the same split with the Profiler on throughout (the noise floor).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from digits import Net, digits_loaders

    settings = make_settings(home, checkpoint={"enabled": False})
    run = prudent.init(name="digits", settings=settings, exit_on_stop=False)
    torch.manual_seed(0)
    train_loader, _ = digits_loaders(32, 0)
    model = Net(128, 0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    run.attach(model=model, optimizer=opt)
    profiler = next(c for c in run.context.components if isinstance(c, Profiler))
    hooks = {Event.BATCH_LOADED: profiler.on_batch_loaded, Event.STEP_END: profiler.on_step_end}
    times: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    with run:
        for epoch in run.epochs(epochs):
            arm = "on" if epoch % 2 == 0 else "off"
            for event, hook in hooks.items():
                handlers = run.context.handlers[event]  # the same list objects the kernel iterates
                if arm == "off" and hook in handlers and unplug:
                    handlers.remove(hook)
                elif arm == "on" and hook not in handlers:
                    handlers.insert(0, hook)
            last = None  # the epoch boundary is not a step
            for x, y in run.batches(train_loader):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
                now = (clock(), time.thread_time())
                if last is not None:
                    times[arm].append((now[0] - last[0], now[1] - last[1]))
                last = now
    return times


def digits_overhead(home: str, epochs: int, reps: int) -> dict[str, Any]:
    digits_step_times(home, 2)  # warm-up
    summary: dict[str, Any] = {"epochs": epochs, "reps": reps}
    for name, unplug in (("ab", True), ("aa", False)):
        ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
        for _ in range(reps):
            times = digits_step_times(home, epochs, unplug)
            for index, clock_name in enumerate(("wall", "cpu")):
                on = statistics.median(t[index] for t in times["on"])
                off = statistics.median(t[index] for t in times["off"])
                ratios[clock_name].append(on / off)
                if unplug and clock_name == "wall":
                    summary.setdefault("off_ms", []).append(1e3 * off)
        summary[name] = {k: {"median_ratio": statistics.median(v), "ratios": v}
                         for k, v in ratios.items()}
    summary["off_ms"] = statistics.median(summary["off_ms"])
    return summary


# report ------------------------------------------------------------------------------------
def print_report(results: list[dict[str, Any]], component: dict[str, Any],
                 digits: dict[str, Any]) -> bool:
    table = Table(title="profiler breakdown vs injected delays (seconds)")
    for column in ("scenario", "category", "injected", "truth (timed)", "profiler",
                   "error vs truth", "error vs injected"):
        table.add_column(column, justify="left" if column in ("scenario", "category") else "right")
    ok = True
    for result in results:
        for category, err in errors(result).items():
            ok = ok and abs(err["vs_truth"]) <= TOLERANCE
            table.add_row(result["scenario"], category, f"{result['nominal_s'][category]:.3f}",
                          f"{result['truth_s'][category]:.3f}",
                          f"{result['measured_s'][category]:.3f}",
                          f"{100 * err['vs_truth']:+.2f}%", f"{100 * err['vs_nominal']:+.2f}%")
    console = Console(width=120)
    console.print(table)
    for result in results:
        console.print(f"  {result['scenario']}: findings {result['findings'] or 'none'}",
                      highlight=False)
    console.print(f"Profiler cost per step (tight loop, median of paired reps): "
                  f"{component['profiler_us_per_step']:.2f} us "
                  f"({component['bare_us']:.2f} us bare -> {component['with_profiler_us']:.2f} us)",
                  highlight=False)
    for clock_name, what in (("wall", "wall time"), ("cpu", "training-thread CPU time")):
        ab, aa = (100 * (digits[k][clock_name]["median_ratio"] - 1) for k in ("ab", "aa"))
        console.print(f"digits median step, {what}: profiling on vs off {ab:+.2f}% (A/A control, "
                      f"on vs on: {aa:+.2f}%); median of {digits['reps']} runs of "
                      f"{digits['epochs']} alternating epochs", highlight=False)
    console.print(f"direct estimate: {component['profiler_us_per_step']:.2f} us of a "
                  f"{digits['off_ms']:.3f} ms digits step = "
                  f"{100 * component['profiler_us_per_step'] / (1e3 * digits['off_ms']):.2f}%",
                  highlight=False)
    console.print(f"{'PASS' if ok else 'FAIL'}: every category within {100 * TOLERANCE:.0f}% "
                  "of the timed truth", highlight=False)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="paired repetitions for overhead")
    parser.add_argument("--tight-steps", type=int, default=20_000)
    parser.add_argument("--digits-epochs", type=int, default=60,
                        help="digits epochs, the Profiler on in every other one (default 60)")
    parser.add_argument("--digits-reps", type=int, default=3,
                        help="digits runs per arm, A/B and A/A (default 3)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for key in [k for k in os.environ if k.startswith("PRUDENT_")]:
        del os.environ[key]
    with tempfile.TemporaryDirectory(prefix="prudent-profile-bench-") as home:
        results = [run_scenario(home, name, spec) for name, spec in SCENARIOS.items()]
        component = component_overhead(home, args.reps, args.tight_steps)
        digits = digits_overhead(home, args.digits_epochs, args.digits_reps)
    ok = print_report(results, component, digits)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "benchmark": "profile_accuracy", "pass": ok, "tolerance": TOLERANCE,
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpu_count": os.cpu_count(), "platform": platform.platform()},
        "accuracy": [{**r, "errors": errors(r)} for r in results],
        "overhead": {"component": component, "digits": digits}}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
