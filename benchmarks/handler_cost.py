"""What each prudent component costs the training thread per step, timed call by call.

Whole-run wall-clock ratios cannot resolve 1% on a shared 2-core VM: their spread is about
10%. So, next to them, the overhead benchmark times every handler call itself: a wrapper
reads ``perf_counter`` around each ``on_batch_loaded`` / ``on_after_backward`` /
``on_step_end`` of each default component, in the same training loop, and divides by the steps.
A few microseconds timed thousands of times are steady even when the machine is not. The
kernel's own cost (``run.batches`` and ``run.step`` with no component) is timed the same way,
against a plain loop over the same batches.

What it leaves out, honestly: work on the components' own threads (the store writer turning
tensors into floats, the system sampler, the checkpoint writer, the cost meter's store
updates) runs beside training, on another core when there is one; rare events (``log``,
``epoch_end``, the end) are not per-step costs; the monitor's activation hooks run inside the
model's forward pass (one step in a hundred). Charged to the component although not its own:
the wrapper's call and two clock reads, ~0.9 us per handler inside this loop (measured on an
empty handler), so the figures lean high. The overhead benchmark's interleaved A/Bs
(``interleaved_ab.py``) time the same work the other way, by the wall clock, hooks included.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import prudent
from prudent.kernel.events import Event

clock = time.perf_counter
PER_STEP_EVENTS = (Event.BATCH_LOADED, Event.AFTER_BACKWARD, Event.STEP_END)
TARGETS_PCT = {"Profiler": 1.0, "Monitor": 2.0}  # issue 5 (profiling), issue 4 (monitoring)


def context_of(run: Any) -> Any:
    """What the components see of a run (its ``RunContext``; the run itself before there was one)."""
    return getattr(run, "context", run)


def component_costs_us(make_run_parts: Callable[[], tuple[Any, Any, Any]], reps: int
                       ) -> dict[str, float]:
    """Median over ``reps`` runs of each component's handler time, in microseconds per step
    (the mean over each run's steps)."""
    per_rep: dict[str, list[float]] = defaultdict(list)
    for _ in range(reps):
        for name, us in _one_run(*make_run_parts()).items():
            per_rep[name].append(us)
    per_rep["kernel"] = [kernel_cost_us() for _ in range(reps)]
    return {name: statistics.median(values) for name, values in per_rep.items()}


def _one_run(model: Any, opt: Any, loader: Any) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)  # this step's seconds, per component
    steps: dict[str, list[float]] = defaultdict(list)
    run = prudent.init(name="handler-cost", exit_on_stop=False)
    context_of(run).wrap_handlers(lambda handler: _timed(handler, totals), PER_STEP_EVENTS)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(1):
            for x, y in run.batches(loader):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
                for name in steps.keys() | totals.keys():
                    steps[name].append(totals.pop(name, 0.0))
    if context_of(run).store is not None:
        context_of(run).store.close()
    # the plain mean: every periodic cost counts (a rule check every 50 steps, a layer sample
    # every 100, a checkpoint snapshot); a step the scheduler took the core away from in the
    # middle of a handler counts too, which the median over repetitions then leaves out
    return {name: 1e6 * sum(seconds) / len(seconds) for name, seconds in steps.items()}


def _timed(handler: Callable[..., None], totals: dict[str, float]) -> Callable[..., None]:
    owner = type(getattr(handler, "__self__", handler)).__name__

    def call(*args: Any) -> None:
        began = clock()
        handler(*args)
        totals[owner] += clock() - began

    return call


def kernel_cost_us(steps: int = 20_000) -> float:
    """``run.batches`` + ``run.step(loss=t)`` with no component, minus a plain loop."""
    batches = [torch.zeros(1)] * steps
    loss = torch.zeros(())
    run = prudent.init(name="kernel-cost", exit_on_stop=False, components=[])
    with run:
        began = clock()
        for _ in run.epochs(1):
            for _batch in run.batches(batches):
                run.step(loss=loss)
        with_kernel = clock() - began
    if context_of(run).store is not None:
        context_of(run).store.close()
    began = clock()
    for _epoch in range(1):
        for _batch in iter(batches):
            pass
    return max(0.0, 1e6 * (with_kernel - (clock() - began)) / steps)


def cost_rows(costs_us: dict[str, float], bare_step_ms: float) -> list[dict[str, Any]]:
    """One row per component (dearest first), then the total, as a share of the bare step."""
    rows = [{"component": name, "us_per_step": us, "pct_of_bare_step": us / (10 * bare_step_ms),
             "target_pct": TARGETS_PCT.get(name)}
            for name, us in sorted(costs_us.items(), key=lambda item: -item[1])]
    total = sum(costs_us.values())
    rows.append({"component": "all", "us_per_step": total,
                 "pct_of_bare_step": total / (10 * bare_step_ms), "target_pct": 3.0})
    return rows


def cost_verdicts(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        if row["target_pct"] is None:
            continue
        ok = row["pct_of_bare_step"] <= row["target_pct"]
        lines.append(f"{'PASS' if ok else 'FAIL'}: {row['component']} costs the training thread "
                     f"{row['us_per_step']:.1f} us a step = {row['pct_of_bare_step']:.2f}% of the "
                     f"bare step (target <= {row['target_pct']:g}%)")
    return lines
