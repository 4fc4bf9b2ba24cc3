"""What prudent adds to a training step, next to a bare PyTorch loop and PyTorch Lightning.

Three variants train the same small MLP (64 -> 128 -> 128 -> 10, batch 32, AdamW) on the same
generated data (``torch.randn``, fixed seed) through the same ``DataLoader``; each run is one
epoch of ``--steps`` batches:

* ``bare``      the plain loop: forward, ``loss.backward()``, ``opt.step()``, ``opt.zero_grad()``;
* ``prudent``   the same loop through ``run.epochs`` / ``run.batches`` / ``run.backward`` /
  ``run.step(loss=loss)``, with prudent's default components (whatever ``prudent.init`` builds
  from default settings; the report names them), its store in a temporary ``PRUDENT_HOME``
  and the console ``plain`` (a line every 10 s, captured so the report stays readable);
* ``lightning`` a ``LightningModule`` with the same model and optimizer, fitted by a ``Trainer``
  with logging, checkpointing, progress bar and model summary off.

The step takes 1-2 ms on one CPU thread (``--threads 1``, the default), where a framework's
per-step cost shows most. Repetitions are paired and interleaved in one process: after one
warm-up run of each variant, every repetition runs each variant once, in an order rotated
each time. The figure is the training loop's wall time divided by its steps; setup
(``prudent.init`` to the end of ``with run:``, or ``Trainer()`` and the rest of ``fit``) is
reported separately. Other processes busy on the machine make a few percent unmeasurable: the
report says how many cores they kept busy.

Two finer measures follow the table: each default component's own time in its handlers,
timed call by call (``handler_cost.py``), and what the monitor alone and all the components
add to the step, each switched on and off every 100 steps inside one long run
(``interleaved_ab.py``).

Reproduce::

    pip install -e '.[bench]'
    python benchmarks/overhead.py                     # 7 repetitions x 600 steps, 1 thread
    python benchmarks/overhead.py --reps 11 --steps 1000 --threads 2 --json /tmp/o.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent
from prudent.wiring.config import load_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from handler_cost import component_costs_us, context_of, cost_rows, cost_verdicts  # noqa: E402
from machine_load import cpu_busy_s

IN_FEATURES, HIDDEN, CLASSES, BATCH_SIZE = 64, 128, 10, 32
LR, SEED = 1e-3, 0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "overhead.json"
NOISY_LOAD = 0.1  # busy cores taken by other processes above which the report warns
TARGET_OVERHEAD = 0.03  # prudent may add at most 3% to the bare step, and less than Lightning

clock = time.perf_counter

WHAT_IS_TIMED = {
    "bare": "loop: the epoch, first batch to last step",
    "prudent": "loop: the epoch inside `with run:` (the epoch-end save included); "
               "setup = init + attach + leaving `with run:`",
    "lightning": "loop: on_train_start to on_train_end; setup = the rest of Trainer() + fit()",
}


@dataclass
class Timing:
    """One run of one variant: its loop, and (where it has one) setup through the end."""

    steps: int
    loop_s: float
    total_s: float | None = None
    components: list[str] | None = None
    step_ends: list[float] | None = None  # clock() after each step

    @property
    def median_step_ms(self) -> float:
        """The median of single steps: what a long run sees (rare saves and one-off costs aside)."""
        ends = self.step_ends or []
        return 1e3 * statistics.median(b - a for a, b in zip(ends, ends[1:]))

    @property
    def ms_per_step(self) -> float:
        return 1e3 * self.loop_s / self.steps

    @property
    def setup_ms(self) -> float | None:
        return None if self.total_s is None else 1e3 * (self.total_s - self.loop_s)


Variant = Callable[[TensorDataset], Timing]


# the shared workload: one epoch of `steps` batches -------------------------------------------
def make_data(steps: int) -> TensorDataset:
    """Generated inputs with labels the MLP can learn (a fixed linear teacher): on random labels
    the loss never falls, and ``loss_not_decreasing``, its windows sized to the run, rightly
    stops a 600-step run within its first tenth."""
    generator = torch.Generator().manual_seed(SEED)
    x = torch.randn(steps * BATCH_SIZE, IN_FEATURES, generator=generator)
    teacher = torch.randn(IN_FEATURES, CLASSES, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(1))


def make_loader(data: TensorDataset) -> DataLoader:
    return DataLoader(data, batch_size=BATCH_SIZE, shuffle=True,
                      generator=torch.Generator().manual_seed(SEED))


def make_model(hidden: int = HIDDEN) -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, CLASSES))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR)


# the variants -------------------------------------------------------------------------------
def run_bare(data: TensorDataset) -> Timing:
    model = make_model()
    opt = make_optimizer(model)
    loader, device, steps = make_loader(data), torch.device("cpu"), 0
    ends: list[float] = []
    start = clock()
    for _epoch in range(1):  # the shape of the prudent loop's run.epochs(1)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            ends.append(clock())
    return Timing(steps=steps, loop_s=clock() - start, step_ends=ends)


def run_prudent(data: TensorDataset) -> Timing:
    model = make_model()
    opt = make_optimizer(model)
    loader = make_loader(data)
    began = clock()
    run = prudent.init(name="overhead", config={"lr": LR, "batch_size": BATCH_SIZE},
                       exit_on_stop=False)
    run.attach(model=model, optimizer=opt)
    ends: list[float] = []
    with run:
        start = clock()
        for _epoch in run.epochs(1):
            for x, y in run.batches(loader):
                x, y = x.to(run.device), y.to(run.device)
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
                ends.append(clock())
        loop_s = clock() - start
    total_s = clock() - began
    context_of(run).store.close()
    if run.status != "completed":
        raise RuntimeError(f"the prudent run ended {run.status} ({run.stop_reason})")
    return Timing(steps=run.state.step, loop_s=loop_s, total_s=total_s,
                  components=[type(c).__name__ for c in context_of(run).components], step_ends=ends)


def lightning_module() -> Any:
    """``lightning.pytorch`` or ``pytorch_lightning``, whichever is installed (None if neither)."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return __import__(name, fromlist=["Trainer"])
        except ImportError:
            continue
    return None


def make_run_lightning(pl: Any, root: str) -> Variant:
    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = make_model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return make_optimizer(self.model)

    class LoopTimer(pl.Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.start = clock()
            self.ends: list[float] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.ends.append(clock())

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.end = clock()

    def run_lightning(data: TensorDataset) -> Timing:
        module, loader, timer = MLP(), make_loader(data), LoopTimer()
        began = clock()
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=len(loader), max_epochs=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[timer], default_root_dir=root)
        trainer.fit(module, loader)
        total_s = clock() - began
        return Timing(steps=trainer.global_step, loop_s=timer.end - timer.start, total_s=total_s,
                      step_ends=timer.ends)

    return run_lightning


def quiet_lightning() -> None:
    """Lightning's advice for real jobs is noise here (one CPU thread, no workers on purpose)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning",
                 "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*`isinstance\(treespec, LeafSpec\)`.*")


# the experiment -----------------------------------------------------------------------------
@contextlib.contextmanager
def prudent_environment(home: str) -> Iterator[io.StringIO]:
    """Default settings except a temporary store and the plain console, whose lines are kept."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("PRUDENT_")}
    for key in saved:
        del os.environ[key]  # a PRUDENT_RUN_ID or PRUDENT_SET from outside would change the runs
    os.environ.update(PRUDENT_HOME=home, PRUDENT_CONSOLE="plain")
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield captured
    finally:
        for key in ("PRUDENT_HOME", "PRUDENT_CONSOLE"):
            os.environ.pop(key, None)
        os.environ.update(saved)


def timed(variant: Variant, data: TensorDataset) -> Timing:
    gc.collect()
    timing = variant(data)
    if timing.steps != len(data) // BATCH_SIZE:
        raise RuntimeError(f"{variant.__name__} ran {timing.steps} steps, not "
                           f"{len(data) // BATCH_SIZE}")
    return timing


def rotated(names: list[str], rep: int) -> list[str]:
    shift = rep % len(names)
    return names[shift:] + names[:shift]


def measure(variants: dict[str, Variant], reps: int, steps: int
            ) -> tuple[dict[str, list[Timing]], list[list[str]]]:
    """One warm-up run of each variant, then ``reps`` rounds of one run each, order rotated."""
    data, names = make_data(steps), list(variants)
    for name in names:
        timed(variants[name], data)
    results: dict[str, list[Timing]] = {name: [] for name in names}
    orders = []
    for rep in range(reps):
        orders.append(rotated(names, rep))
        for name in orders[-1]:
            results[name].append(timed(variants[name], data))
        line = "  ".join(f"{n} {results[n][-1].ms_per_step:.3f}" for n in names)
        print(f"  rep {rep + 1}/{reps} ({' > '.join(orders[-1])}): {line} ms/step", flush=True)
    return results, orders


@contextlib.contextmanager
def other_load() -> Iterator[dict[str, float | None]]:
    """Cores other processes kept busy meanwhile (Linux): noise that pairing cannot remove."""
    found: dict[str, float | None] = {"other_busy_cores": None}
    began, busy, own = clock(), cpu_busy_s(), own_cpu_s()
    yield found
    ended = cpu_busy_s()
    if busy is not None and ended is not None:
        others = (ended - busy) - (own_cpu_s() - own)
        found["other_busy_cores"] = max(0.0, others) / (clock() - began)


def own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


# the report ---------------------------------------------------------------------------------
def summarize(results: dict[str, list[Timing]]) -> dict[str, dict[str, Any]]:
    bare = [t.ms_per_step for t in results["bare"]]
    summary = {}
    for name, timings in results.items():
        ms = [t.ms_per_step for t in timings]
        setup = [t.setup_ms for t in timings if t.setup_ms is not None]
        step = [t.median_step_ms for t in timings]
        bare_step = [t.median_step_ms for t in results["bare"]]
        summary[name] = {
            "median_step_ms": statistics.median(step),
            "step_ratio_of_medians": statistics.median(step) / statistics.median(bare_step),
            "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
            "ratio_of_medians": statistics.median(ms) / statistics.median(bare),
            "median_paired_ratio": statistics.median(m / b for m, b in zip(ms, bare)),
            "median_setup_ms": statistics.median(setup) if setup else None,
            "timed": WHAT_IS_TIMED[name],
        }
    return summary


def verdict(summary: dict[str, dict[str, Any]]) -> str:
    """On the median single step (the issue's measure); the whole-loop mean is shown too."""
    prudent_ratio = summary["prudent"]["step_ratio_of_medians"]
    ok = prudent_ratio - 1 <= TARGET_OVERHEAD
    text = (f"prudent adds {100 * (prudent_ratio - 1):+.1f}% to the median step "
            f"(target <= {100 * TARGET_OVERHEAD:.0f}%; whole loop incl. saves "
            f"{100 * (summary['prudent']['ratio_of_medians'] - 1):+.1f}%)")
    if "lightning" in summary:
        lightning_ratio = summary["lightning"]["step_ratio_of_medians"]
        ok = ok and prudent_ratio < lightning_ratio
        text += (f", Lightning adds {100 * (lightning_ratio - 1):+.1f}% "
                 f"(whole loop {100 * (summary['lightning']['ratio_of_medians'] - 1):+.1f}%)")
    return f"{'PASS' if ok else 'FAIL'}: {text}"


def machine_info(threads: int, pl: Any) -> dict[str, Any]:
    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "prudent": prudent.__version__, "lightning": getattr(pl, "__version__", None),
        "torch_threads": threads, "cpu_count": os.cpu_count(), "platform": platform.platform(),
    }


def training_parts(data: TensorDataset, hidden: int = HIDDEN
                   ) -> Callable[[], tuple[nn.Module, Any, DataLoader]]:
    def parts() -> tuple[nn.Module, Any, DataLoader]:
        model = make_model(hidden)
        return model, make_optimizer(model), make_loader(data)

    return parts


def print_costs(rows: list[dict[str, Any]], bare_step_ms: float) -> None:
    table = Table(title="the training thread's time in prudent's handlers, per step",
                  caption=f"timed call by call (median of reps); share of the bare median step "
                  f"{bare_step_ms:.3f} ms; see benchmarks/handler_cost.py")
    for column in ("component", "us/step", "% of bare step", "target"):
        table.add_column(column, justify="left" if column == "component" else "right")
    for row in rows:
        target = row["target_pct"]
        table.add_row(row["component"], f"{row['us_per_step']:.1f}",
                      f"{row['pct_of_bare_step']:.2f}", "-" if target is None else f"<= {target:g}%")
    console = Console()
    console.print(table)
    for line in cost_verdicts(rows):
        console.print(line, highlight=False)


def print_report(summary: dict[str, dict[str, Any]], info: dict[str, Any], reps: int,
                 steps: int) -> None:
    table = Table(title=f"ms per training step, {reps} paired reps x {steps} steps",
                  caption=f"MLP {IN_FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH_SIZE}, "
                  "AdamW; x bare: ratio of medians / median of paired ratios")
    table.add_column("variant")
    for column in ("median step", "x bare", "loop mean", "min", "max", "x bare", "x bare paired",
                   "setup ms/run"):
        table.add_column(column, justify="right")
    for name, row in summary.items():
        setup = row["median_setup_ms"]
        table.add_row(name, f"{row['median_step_ms']:.3f}", f"{row['step_ratio_of_medians']:.3f}",
                      f"{row['median_ms']:.3f}", f"{row['min_ms']:.3f}",
                      f"{row['max_ms']:.3f}", f"{row['ratio_of_medians']:.3f}",
                      f"{row['median_paired_ratio']:.3f}",
                      "-" if setup is None else f"{setup:.0f}")
    console = Console()
    console.print(table)
    for name, row in summary.items():
        console.print(f"  {name}: {row['timed']}", highlight=False)
    console.print("machine: " + ", ".join(f"{k} {_short(v)}" for k, v in info.items()
                                          if v is not None), highlight=False)
    console.print(verdict(summary), highlight=False)
    others = info.get("other_busy_cores")
    if others is not None and others > NOISY_LOAD:
        console.print(f"[yellow]warning: other processes kept {others:.2f} cores busy during the "
                      "measurement; rerun on a quiet machine before trusting a few percent")


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "+".join(map(str, value))
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def interleaved_ab(which: str, runs: int, steps: int, block: int) -> dict[str, Any]:
    """``interleaved_ab.py``'s measure and verdict (imported here: that module imports this one)."""
    from interleaved_ab import run_ab, verdict

    result = run_ab(which, runs=runs, steps=steps, block=block)
    return {**result, "verdict": verdict(result)}


def write_json(path: Path, args: argparse.Namespace, info: dict[str, Any],
               summary: dict[str, dict[str, Any]], results: dict[str, list[Timing]],
               orders: list[list[str]], settings: dict[str, Any],
               costs: list[dict[str, Any]], interleaved: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "overhead", "verdict": verdict(summary), "machine": info,
        "workload": {"model": [IN_FEATURES, HIDDEN, HIDDEN, CLASSES], "batch_size": BATCH_SIZE,
                     "optimizer": "AdamW", "lr": LR, "seed": SEED, "steps": args.steps,
                     "epochs_per_run": 1, "reps": args.reps, "warmup_runs": 1},
        "prudent_settings": settings, "summary": summary, "orders": orders,
        "handler_costs": costs, "handler_verdicts": cost_verdicts(costs),
        "interleaved_ab": interleaved,
        "raw": {name: [{**asdict(t), "ms_per_step": t.ms_per_step, "setup_ms": t.setup_ms}
                       for t in timings] for name, timings in results.items()},
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="paired repetitions (default 7)")
    parser.add_argument("--steps", type=int, default=600, help="steps per run (default 600)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1: the other core is left to the "
                        "frameworks' background threads)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help=f"where to write results (default {DEFAULT_JSON})")
    return parser.parse_args(argv)


def build_variants(pl: Any, root: str) -> dict[str, Variant]:
    variants: dict[str, Variant] = {"bare": run_bare, "prudent": run_prudent}
    if pl is None:
        print("PyTorch Lightning is not installed: skipping the 'lightning' variant "
              "(pip install -e '.[bench]')", file=sys.stderr)
    else:
        quiet_lightning()
        variants["lightning"] = make_run_lightning(pl, root)
    return variants


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pl = lightning_module()
    with tempfile.TemporaryDirectory(prefix="prudent-bench-") as home:
        variants = build_variants(pl, home)
        print(f"one warm-up run each, then {args.reps} x {args.steps} steps per variant on "
              f"{args.threads} torch thread(s)...", flush=True)
        with prudent_environment(str(Path(home) / "prudent")) as console_lines:
            settings = load_settings().model_dump(mode="json")
            with other_load() as load:
                results, orders = measure(variants, args.reps, args.steps)
            costs_us = component_costs_us(training_parts(make_data(args.steps)), args.reps)
            interleaved = {which: interleaved_ab(which, runs=3, steps=6000, block=100)
                           for which in ("monitor", "all")}
    if torch.get_num_threads() != args.threads:
        raise RuntimeError(f"a variant changed torch's threads to {torch.get_num_threads()}")
    print(f"(prudent's console wrote {len(console_lines.getvalue().splitlines())} lines, "
          "captured: the summary at each run's end)")
    info = {**machine_info(args.threads, pl), **load,
            "prudent_components": results["prudent"][0].components}
    summary = summarize(results)
    print_report(summary, info, args.reps, args.steps)
    costs = cost_rows(costs_us, summary["bare"]["median_step_ms"])
    print_costs(costs, summary["bare"]["median_step_ms"])
    for result in interleaved.values():
        print(result["verdict"])
    write_json(args.json, args, info, summary, results, orders, settings, costs, interleaved)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
