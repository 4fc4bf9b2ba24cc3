"""What prudent's Lightning callback adds to a step, measured inside one fit: its per-step
hooks on for a block of steps, then off (Lightning skips them) for the next, and so on.

``adapters.py`` compares two fits, one with the callback and one without, as the adapters
issue asks. On this shared 2-core VM two identical fits' median steps differ by several
percent, so its rounds spread 1.01-1.13 and a percent is out of its reach. Here both arms share
one fit (the process, the data, the model, whatever the machine does meanwhile), as
``interleaved_ab.py`` measures a hand-written loop, and drift cancels between neighbouring
blocks: repeated runs agree within a few tenths of a percent. Off means the callback's four
per-step hooks are None on the instance, so Lightning's dispatch skips them (as if the callback
were not there for those steps); the monitor's clock is paused meanwhile, so its overhead
budget sees only the steps it watched, and activation hooks armed for a sample are taken off.
The prudent run sees the on-blocks' steps only: with 2 x ``--steps`` in the fit it is a run of
``--steps`` steps whose planned length is the fit's (2 x), so the monitor's periodic work is
that of a run twice as long. What the arms still share leans the figure low: the cache traffic
of prudent's work lingers into the first steps of an off-block (the first step after each switch
is dropped), and prudent's threads run when they run.

``--pause`` takes components out of the run (``RunContext.pause``) for the whole fit: with
``--pause all`` what is left is the adapter and the kernel (the shell every step pays).

Reproduce (the figures quoted in docs/benchmarks.md)::

    python benchmarks/adapters_within_fit.py                  # the benchmark's 1.2 ms step
    python benchmarks/adapters_within_fit.py --steps 2000     # a longer fit
    python benchmarks/adapters_within_fit.py --hidden 1024    # a ~5 ms step
    python benchmarks/adapters_within_fit.py --pause monitor  # every component but the monitor
    python benchmarks/adapters_within_fit.py --pause all      # the shell alone
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))
from adapters import digits_batches  # noqa: E402 - the same data as the between-fit benchmark
from interleaved_ab import MonitorClock, _bootstrap_ci  # noqa: E402 - as the kernel's A/B

RESULTS = ROOT / "benchmarks" / "results" / "adapters_within_fit.json"
PER_STEP_HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step",
                  "on_train_batch_end")


class BlockSwitch:
    """Turns a PrudentCallback's per-step hooks on and off, every ``block`` optimizer steps,
    from a callback placed after it (so a switch falls between two steps), and times each step
    from one ``on_train_batch_end`` to the next under the arm it ran in."""

    def __init__(self, prudent_callback: Any, block: int, clock: Any = time.perf_counter,
                 start_on: bool = True) -> None:
        from prudent.monitor import Monitor

        self.callback, self.block, self.clock = prudent_callback, block, clock
        self.real = {name: getattr(prudent_callback, name) for name in PER_STEP_HOOKS}
        self.times: dict[bool, list[float]] = {True: [], False: []}
        context = prudent_callback.adapter.ctx
        monitor = next((c for c in context.components if isinstance(c, Monitor)), None)
        self.monitor_clock = MonitorClock(monitor) if monitor is not None else None
        self.on, self._steps, self._last = True, 0, None
        self.set(start_on)

    def set(self, on: bool) -> None:
        self.on = on
        for name, hook in self.real.items():
            setattr(self.callback, name, hook if on else None)
        if self.monitor_clock is not None:
            self.monitor_clock.set(on)

    def step_ended(self) -> None:
        now = self.clock()
        self._steps += 1
        if self._last is not None and self._steps % self.block != 1:  # a switch's first step
            self.times[self.on].append(now - self._last)
        if self._steps % self.block == 0:
            self.set(not self.on)
        self._last = self.clock()


def one_fit(steps: int, block: int, hidden: int, pause: list[str], clock: Any,
            start_on: bool) -> dict[bool, list[float]]:
    """One fit of ``2 * steps`` digits batches (one epoch), the callback on for half of them."""
    import lightning as L
    from lightning_digits import LitDigits

    from prudent.lightning import PrudentCallback

    callback = PrudentCallback(name="bench-within-fit", config={}, exit_on_stop=False)
    context = callback.adapter.ctx
    names = [c.name for c in context.components]
    unknown = [name for name in pause if name != "all" and name not in names]
    if unknown:
        context.finish("completed")
        raise SystemExit(f"--pause {' '.join(unknown)}: no such component in a default run; "
                         f"name any of {', '.join(names)}, or all")
    if pause:
        context.pause([c for c in context.components if "all" in pause or c.name in pause])
    switch = BlockSwitch(callback, block, clock, start_on)

    class Steps(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            switch.step_ended()

    L.seed_everything(0, verbose=False)
    total = 2 * steps
    train = digits_batches(total)
    trainer = L.Trainer(max_steps=total, callbacks=[callback, Steps()], accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    gc.collect()
    trainer.fit(LitDigits(lr=0.05, hidden=hidden), train)
    switch.set(True)  # the run's end as the callback expects it
    return switch.times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="fits (each its own figure)")
    parser.add_argument("--steps", type=int, default=400,
                        help="steps with the callback on in each fit (as many off)")
    parser.add_argument("--block", type=int, default=20, help="steps between two switches")
    parser.add_argument("--hidden", type=int, default=64, help="the digits MLP's width")
    parser.add_argument("--pause", nargs="*", default=[],
                        help="components out for the whole fit (monitor, metrics, capture, "
                        "profile, checkpoint, cost, record, console; all)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    load = os.getloadavg()
    ratios, on_ms, off_ms = [], [], []
    with tempfile.TemporaryDirectory() as home:
        os.environ.update(PRUDENT_HOME=home, PRUDENT_CONSOLE="off")
        for i in range(args.rounds):
            times = one_fit(args.steps, args.block, args.hidden, args.pause, clock, i % 2 == 0)
            on, off = statistics.median(times[True]), statistics.median(times[False])
            ratios.append(on / off)
            on_ms.append(on * 1e3)
            off_ms.append(off * 1e3)
            print(f"fit {i + 1}/{args.rounds}: median step off {off * 1e3:.3f} ms, on "
                  f"{on * 1e3:.3f} ms, ratio {on / off:.4f} ({len(times[True])} / "
                  f"{len(times[False])} steps)", file=sys.stderr, flush=True)
    load = (*load, *os.getloadavg())
    ci = _bootstrap_ci(ratios) if len(ratios) > 1 else [ratios[0]] * 2
    ratio = statistics.median(ratios)
    paused = ", ".join(args.pause) or "none"
    print(f"lightning, hidden {args.hidden}, {args.steps} steps on / {args.steps} off in blocks "
          f"of {args.block}, components paused: {paused}")
    print(f"median step off {statistics.median(off_ms):.3f} ms, on {statistics.median(on_ms):.3f}"
          f" ms: ratio {ratio:.4f} (fits {min(ratios):.4f}-{max(ratios):.4f}, 90% CI "
          f"{ci[0]:.4f}-{ci[1]:.4f}); target <= 1.03: {'met' if ratio <= 1.03 else 'MISSED'}")
    print(f"load average {load[0]:.2f} at the start, {load[3]:.2f} at the end "
          f"({os.cpu_count()} CPUs)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "clock": args.clock,
        "torch": torch.__version__, "cpus": os.cpu_count(), "load_average": load,
        "framework": "lightning", "hidden": args.hidden, "steps_on": args.steps,
        "block": args.block, "paused": args.pause, "ratio_median": ratio, "ratios": ratios,
        "ratio_ci90": ci, "median_step_ms_off": statistics.median(off_ms),
        "median_step_ms_on": statistics.median(on_ms), "target": 1.03,
        "meets_target": ratio <= 1.03}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
