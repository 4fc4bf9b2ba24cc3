"""What prudent costs per optimizer step when the loop accumulates gradients over micro-steps.

The same MLP and data, one process, three loops side by side: one backward per step (batch
64), two micro-steps of 32, four of 16. Every default component's per-step handlers are timed
call by call (``RunContext.wrap_handlers``), as in ``handler_cost.py``; what matters is that
a step of several micro-steps costs no more than a step of one: the gradient hooks run once per
optimizer step, not once per micro-step (issue 19). The kernel's own ``run.backward`` with its
micro-step bookkeeping is timed the same way against a bare ``loss.backward()``.

    .venv/bin/python benchmarks/micro_steps.py [--steps 1500] [--reps 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import prudent
from prudent.kernel.events import Event

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import prudent_environment  # noqa: E402 - the benchmarks' own helper

clock = time.perf_counter
PER_STEP = (Event.BATCH_LOADED, Event.AFTER_BACKWARD, Event.STEP_END)
BATCH = 64


def one_loop(micro: int, steps: int) -> dict[str, float]:
    """Handler µs and handler calls per optimizer step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(steps * BATCH, 64), torch.randint(0, 10, (steps * BATCH,))
    spent = {"handlers_s": 0.0, "calls": 0.0}
    run = prudent.init(name=f"micro-{micro}", exit_on_stop=False)

    def timed(handler: Any) -> Any:
        def call(*args: Any) -> None:
            began = clock()
            handler(*args)
            spent["handlers_s"] += clock() - began
            spent["calls"] += 1
        return call

    run.context.wrap_handlers(timed, PER_STEP)
    run.attach(model=model, optimizer=opt)
    size = BATCH // micro
    with run:
        for it in run.steps(steps):
            for m in range(micro):
                rows = slice(it * BATCH + m * size, it * BATCH + (m + 1) * size)
                loss = F.cross_entropy(model(x[rows]), y[rows]) / micro
                run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
    if run.context.store is not None:
        run.context.store.close()
    return {"handler_us_per_step": 1e6 * spent["handlers_s"] / steps,
            "handler_calls_per_step": spent["calls"] / steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[int, dict[str, list[float]]] = {m: defaultdict(list) for m in (1, 2, 4)}
    with prudent_environment(tempfile.mkdtemp()):
        for _ in range(args.reps):
            for micro in results:  # interleaved: the arms share the machine's drift
                for key, value in one_loop(micro, args.steps).items():
                    results[micro][key].append(value)
    rows = [{"micro_steps": m, **{k: statistics.median(v) for k, v in r.items()}}
            for m, r in results.items()]
    base = rows[0]["handler_us_per_step"]
    print(f"{'micro-steps':>11} {'handler us/step':>16} {'calls/step':>11} {'vs 1':>7}")
    for row in rows:
        print(f"{row['micro_steps']:>11} {row['handler_us_per_step']:>16.1f} "
              f"{row['handler_calls_per_step']:>11.2f} "
              f"{row['handler_us_per_step'] / base:>6.2f}x")
    two = rows[1]["handler_us_per_step"] / base  # the measure: 2 micro-steps vs 1
    same_calls = all(abs(r["handler_calls_per_step"] - rows[0]["handler_calls_per_step"]) < 0.1
                     for r in rows)
    verdict = "PASS" if two <= 1.10 and same_calls else "FAIL"
    print(f"{verdict}: a step of 2 micro-steps costs {two:.2f}x the handler time of a step of one "
          f"(target <= 1.0x, 10% timing noise allowed); the handlers run "
          f"{'as often' if same_calls else 'MORE often'} per step whatever the micro-steps")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "two_micro_steps_ratio": two,
                                         "same_calls_per_step": same_calls,
                                         "verdict": verdict}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
