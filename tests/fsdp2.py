"""FSDP2 (``fully_shard``) on the CPU with gloo, for the tests of the guardrails on shards.

- :func:`one_rank_mesh`: a process group of one rank in this process, and its 1-D mesh.
- :func:`sharded_mlp`: an MLP and a plain copy of it, the copy's layers ``fully_shard``-ed.
- :func:`two_ranks`: :func:`watch_two_ranks` in two processes; each writes what its
  monitor measured and the plain model's numbers for the same steps (``rank{r}.json``).
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from prudent.monitor import MonitorSettings, Rule, Window
from prudent.monitor.shards import ShardedNorms
from prudent.monitor.stats import StepStats
from prudent.testing import FakeClock

__all__ = ["batch", "one_rank_mesh", "sharded_mlp", "two_ranks", "watch_two_ranks"]

BATCH = 8  # examples per rank and step
ROOT = Path(__file__).parents[1]


@contextmanager
def one_rank_mesh(folder: Path) -> Iterator[Any]:
    """A gloo group of this process alone (a file store in ``folder``: no port, no
    environment variable), and its mesh; destroyed on exit."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0,
                            world_size=1, timeout=timedelta(seconds=30))
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def sharded_mlp(mesh: Any, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """(plain, sharded): the same weights; every Linear and the root ``fully_shard``-ed."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    plain = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 2))
    sharded = copy.deepcopy(plain)
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    return plain, sharded


def batch(step: int, num_ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's examples of ``step``, rank after rank."""
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH * num_ranks, 8, generator=generator)
    return x, (x[:, 0] + 0.3 * x[:, 1] > 0).long()


def two_ranks(folder: Path, num_steps: int, timeout_s: float = 120) -> list[dict[str, Any]]:
    """Run :func:`watch_two_ranks` in two processes; their reports (a hang fails)."""
    code = f"from tests.fsdp2 import watch_two_ranks; watch_two_ranks({{}}, {str(folder)!r}, " \
           f"{num_steps})"
    ranks = [subprocess.Popen([sys.executable, "-c", code.format(rank)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    try:
        outputs = [process.communicate(timeout=timeout_s)[0] for process in ranks]
    except subprocess.TimeoutExpired:
        raise AssertionError("the ranks hung: their collectives did not match") from None
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    assert [process.returncode for process in ranks] == [0, 0], outputs
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(2)]


class _TickingClock(FakeClock):
    """Each read takes ``tick`` seconds: a norm costs a tick, so ranks with different ticks
    want different strides (what differs between real ranks: their clocks)."""

    def __init__(self, tick: float) -> None:
        super().__init__()
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def watch_two_ranks(rank: int, folder: str, num_steps: int) -> None:
    """One rank: FSDP2 trains with AdamW, its StepStats measure; a plain copy, given the
    full weights before each step and every rank's examples, gives the expected numbers.
    The ranks disagree on purpose about what to measure when: their clocks (so their
    strides), rank 1 sees loss jumps, rank 0 moves its samples, and they take windows at
    different steps. Every collective must still match."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (2,))
        report = _train(rank, mesh, num_steps)
        report["monitored"] = _monitored(rank, mesh, Path(folder), num_steps)
        report["reduce_2d"] = _reduce_on_a_2d_mesh(rank)
        Path(folder, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def _train(rank: int, mesh: Any, num_steps: int) -> dict[str, Any]:
    plain, model = sharded_mlp(mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    clock = _TickingClock(tick=8e-6 if rank == 0 else 3e-6)
    stats = StepStats(MonitorSettings(sample_every_steps=7, check_every_steps=10), clock=clock)
    stats.attach({"model": model, "optimizer": opt})
    expected: dict[int, Any] = {}
    windows = []
    for step in range(1, num_steps + 1):
        clock.advance(1e-3)
        plain.load_state_dict(_full(model))
        x, y = batch(step, 2)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        loss = F.cross_entropy(model(x[mine]), y[mine])
        loss.backward()
        F.cross_entropy(plain(x), y).backward()
        stats.after_backward(step)
        opt.step()
        opt.zero_grad()
        expected[step] = _expected(plain, _full(model))
        plain.zero_grad()
        if rank == 1 and step in (11, 23):
            stats.look_closer(step)
        if rank == 0 and step == 13:
            stats.fit(num_steps, sample_every=5, step=step)
        stats.step_end(step, loss)
        if step % (5 if rank == 0 else 3) == 0 or step == num_steps:
            windows.append(_window(stats.take_window()))
    return {"expected": expected, "windows": windows}


class _Seen(Rule):
    """Notes what the monitor hands the rules: the measured norms, the layer samples."""

    name = "seen"
    needs = frozenset({"steps", "layers"})

    def __init__(self) -> None:
        super().__init__()
        self.norms: list[tuple[int, float]] = []
        self.samples: list[tuple[int, float | None]] = []

    def check(self, window: Window) -> None:
        self.norms += window.grad_norms()
        self.samples += [(sample.step, sample.update_ratio) for sample in window.layers]


def _monitored(rank: int, mesh: Any, folder: Path, num_steps: int) -> dict[str, Any]:
    """The Monitor in a run (its sleeps and wakes): rank 1's loss jumps twice (its own
    look closer), rank 0 alone samples sooner from step 12, and their checks differ."""
    import prudent
    from prudent.monitor import Monitor
    from prudent.testing import make_settings

    _, model = sharded_mlp(mesh, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = make_settings(folder / f"home{rank}", checkpoint={"enabled": False},
                             monitor={"sample_every_steps": 5, "check_every_steps": 3 + 2 * rank})
    monitor, seen = Monitor(settings.monitor, quiet=True), _Seen()
    monitor.rules["seen"] = seen
    run = prudent.init(name="fsdp2", settings=settings, exit_on_stop=False, components=[monitor])
    run.attach(model=model, optimizer=opt)
    with run:
        for step in run.steps(num_steps):
            x, y = batch(step + 1, 2)
            mine = slice(rank * BATCH, (rank + 1) * BATCH)
            loss = F.cross_entropy(model(x[mine]), y[mine])
            if rank == 1 and step + 1 in (17, 27):
                loss = loss * 10
            if rank == 0 and step + 1 == 12:
                monitor.stats.fit(num_steps, sample_every=3, step=step)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
    return {"norms": seen.norms, "samples": seen.samples}


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights (a collective: every rank calls it at the same point)."""
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def _expected(plain: nn.Module, after: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The plain model's gradient norms, and the update the sharded one made."""
    named = dict(plain.named_parameters())
    grads = [p.grad for p in named.values()]
    update = {k: float((after[k] - p.detach()).norm()) for k, p in named.items()}
    weight = {k: float(p.detach().norm()) for k, p in named.items()}
    return {"grad_norm": float(torch.nn.utils.get_total_norm(grads)),
            "grad_rms": {k: float(p.grad.norm()) / math.sqrt(p.numel())
                         for k, p in named.items() if p.dim() >= 2},
            "update_ratio": math.hypot(*update.values()) / math.hypot(*weight.values()),
            "layer_update_ratio": {k: update[k] / weight[k] for k in named}}


def _window(window: Any) -> dict[str, Any]:
    return {"steps": window.steps, "grad_norm": window.grad_norm,
            "layers": [{"step": s.step, "grad_rms": s.grad_rms, "update_ratio": s.update_ratio,
                        "layer_update_ratio": s.layer_update_ratio} for s in window.layers]}


def _reduce_on_a_2d_mesh(rank: int) -> dict[str, Any]:
    """A DTensor sharded over both dims of a (2, 1) mesh (two groups: the plan then travels
    in an all_reduce of its own), a replicated one and a plain tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 1))
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = [distribute_tensor(full, mesh, [Shard(0), Shard(1)]),
               distribute_tensor(2 * full, mesh, [Replicate(), Replicate()]), 3 * full]
    shards = ShardedNorms.find(tensors)
    assert shards is not None
    norms, agreed = shards.reduce(tensors, shards.local_norms(tensors, torch.device("cpu")),
                                  plan=(5 + rank,), wishes=(rank,))
    return {"norms": norms, "agreed": agreed, "expected": float(full.norm())}
