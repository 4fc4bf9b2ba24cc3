"""What agreeing across ranks adds to a DDP step: A/B blocks inside one torchrun job.

Issue 33 measured the old stop agreement (one blocking ``all_reduce`` of a flag, read back
with ``.item()``, every step) at +0.73 ms of +1.1 ms per step on 2 gloo ranks. Its target for
the new one (post a two-number ``all_reduce`` on prudent's own gloo group as a step ends, read
it as the next one ends): at most 30 us per step over plain DDP. Separate runs on a shared VM
differ by more than that, so the arms take turns inside one job, every ``block`` steps, in
an order every rank draws from the same seed:

- ``ddp``: the user's DDP step alone (forward, backward with DDP's gradient all-reduce, step);
- ``kernel``: the same plus ``run.step()`` with every component paused (the kernel's own cost);
- ``agreement``: the kernel plus prudent's stop coordinator and poster (what prudent runs);
- ``blocking``: the kernel plus the old per-step blocking all-reduce (for comparison).

Each block's mean step (an agreement comes once in many steps: a median would not see it)
is paired with the ``ddp`` block of the same round; the table gives the median of those
differences, in microseconds, and their quartiles, on rank 0's wall clock.

Reproduce (launches torchrun itself; 2 ranks on CPU with gloo)::

    python benchmarks/ranks_agreement.py                    # 16000 steps, ~40 s on 2 cores
    python benchmarks/ranks_agreement.py --steps 12000 --hidden 256 --ranks 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prudent.kernel.events import Component

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchrun_job import RESULT_ENV, run_as_job  # noqa: E402

TARGET_US = 30.0
ARMS = ("ddp", "kernel", "agreement", "blocking")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=16000)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--agree-every-s", type=float, default=None,
                        help="run.ranks_agree_every_s (default: prudent's)")
    parser.add_argument("--json", default="benchmarks/results/ranks_agreement.json")
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        launch(args)
        return
    worker(args)


def launch(args: argparse.Namespace) -> None:
    """Run this file under torchrun, then print rank 0's table."""
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
        env.update(PRUDENT_HOME=home, PRUDENT_CONSOLE="off", PRUDENT_CHECKPOINT="false")
        if args.agree_every_s is not None:
            env["PRUDENT_RANKS_AGREE_EVERY_S"] = str(args.agree_every_s)
        run_as_job(__file__, args.ranks, env, args.json, report)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import prudent
    from prudent.distributed.torchrun import AgreementPoster, StopCoordinator

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    run = prudent.init(name="ranks-agreement")
    ctx = run.context
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    blocking = BlockingFlag()
    ctx.add_component(blocking)
    agreement = [c for c in ctx.components if isinstance(c, (StopCoordinator, AgreementPoster))]
    every = list(ctx.components)
    arms = {"ddp": None, "kernel": [], "agreement": agreement, "blocking": [blocking]}
    order = random.Random(7)  # the same on every rank: the ranks switch arms together
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    in_step: dict[str, float] = dict.fromkeys(ARMS, 0.0)  # inside run.step, all blocks
    clock = time.perf_counter
    with run:
        for _ in range(args.steps // (args.block * len(ARMS))):
            for arm in order.sample(ARMS, len(ARMS)):
                on = arms[arm]
                ctx.pause(every, paused=True)
                if on:
                    ctx.pause(on, paused=False)
                steps = []
                for _ in range(args.block):
                    started = clock()
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if on is not None:
                        before = clock()
                        run.step()
                        in_step[arm] += clock() - before
                    steps.append(clock() - started)
                times[arm].append(statistics.fmean(steps[1:]))  # the first pays the switch
        ctx.pause(every, paused=False)
    if dist.get_rank() == 0:
        result = summary(times, args)
        for arm in ARMS[1:]:
            result["arms"][arm]["in_run_step_us"] = in_step[arm] / (len(times[arm]) * args.block) * 1e6
        Path(os.environ[RESULT_ENV]).write_text(json.dumps(result))
    dist.destroy_process_group()


class BlockingFlag(Component):
    """The old agreement: a blocking all-reduce of one flag, read back, every step."""

    name = "blocking_flag"

    def on_step_end(self, run: Any, metrics: Any) -> None:
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if run.stop_requested else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        int(flag.item())


def summary(times: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    ddp = times["ddp"]
    rows = {}
    for arm in ARMS[1:]:
        added = sorted((a - b) * 1e6 for a, b in zip(times[arm], ddp))
        q1, median, q3 = statistics.quantiles(added, n=4)
        rows[arm] = {"added_us": statistics.median(added), "q1_us": q1, "q3_us": q3,
                     "blocks": len(added)}
    alone = sorted((a - b) * 1e6 for a, b in zip(times["agreement"], times["kernel"]))
    q1, median, q3 = statistics.quantiles(alone, n=4)
    rows["agreement_over_kernel"] = {"added_us": statistics.median(alone), "q1_us": q1,
                                     "q3_us": q3, "blocks": len(alone)}
    return {"ddp_step_us": statistics.median(ddp) * 1e6, "arms": rows, "target_us": TARGET_US,
            "agree_every_s": run_settings_agree_every_s(),
            "steps": args.steps, "block": args.block, "hidden": args.hidden,
            "ranks": args.ranks, "cores": os.cpu_count()}


def run_settings_agree_every_s() -> float:
    from prudent.wiring.config import load_settings

    return load_settings().run.ranks_agree_every_s


def report(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"added to a {result['ranks']}-rank DDP step of "
                  f"{result['ddp_step_us']:.0f} us (rank 0's wall clock, median of paired block means)")
    for column in ("arm", "added us/step", "q1-q3", "blocks", "inside run.step us"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm, row in result["arms"].items():
        inside = row.get("in_run_step_us")
        table.add_row(arm, f"{row['added_us']:.1f}", f"{row['q1_us']:.1f} to {row['q3_us']:.1f}",
                      str(row["blocks"]), "" if inside is None else f"{inside:.1f}")
    Console().print(table)
    alone = result["arms"]["agreement_over_kernel"]
    print(f"the agreement alone (paired with the kernel's blocks): {alone['added_us']:.1f} "
          f"us/step, q1-q3 {alone['q1_us']:.1f} to {alone['q3_us']:.1f} (target <= "
          f"{TARGET_US:.0f}); the old blocking flag over the kernel: "
          f"{result['arms']['blocking']['added_us'] - result['arms']['kernel']['added_us']:.1f}")


if __name__ == "__main__":
    main()
