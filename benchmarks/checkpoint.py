"""How long the training loop is blocked per checkpoint, side by side in one run.

For model + AdamW states of about 50, 200 and 800 MB, each repetition saves the same state
with: plain ``torch.save`` (what most loops do: no fsync, no checksum), prudent synchronous
(the model and optimizer through DCP's state-dict API and written as DCP shards, the rest in
``state.pt``: staged, fsynced, renamed, checksummed, read back), prudent asynchronous (the
loop takes the state dicts and copies their tensors to host memory; the rest runs in the
background), and
``torch.distributed.checkpoint.async_save`` when it runs here. Between repetitions the
optimizer takes a step, so every save writes new values. Prints the median blocked time per
method and the ratio to ``torch.save``; writes JSON.

    python benchmarks/checkpoint.py [--sizes-mb 50 200 800] [--reps 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from prudent.checkpoint.sharded import dcp_entries, module_pairs
from prudent.checkpoint.storage import LocalStorage, checkpoint_name
from prudent.checkpoint.writer import CheckpointWriter

Save = Callable[[torch.nn.Module, torch.optim.Optimizer, int], tuple[float, Callable[[], None]]]


def make_state(size_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model whose parameters + AdamW moments take about ``size_mb`` MB."""
    width = 2048
    num_params = size_mb * 1e6 / 4 / 3  # params + exp_avg + exp_avg_sq, float32
    layers = max(1, round(num_params / (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step(model, opt)
    return model, opt


def step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad()


def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def methods(folder: Path) -> dict[str, Save]:
    """name -> save(model, optimizer, rep) returning (blocked seconds, wait-until-durable)."""
    sync = CheckpointWriter(LocalStorage(folder / "sync"), keep=1, asynchronous=False)
    asyn = CheckpointWriter(LocalStorage(folder / "async"), keep=1, asynchronous=True)

    def torch_save(model: torch.nn.Module, opt: torch.optim.Optimizer,
                   rep: int) -> tuple[float, Callable[[], None]]:
        started = time.perf_counter()
        torch.save(state_of(model, opt), folder / "plain.pt")
        return time.perf_counter() - started, lambda: None

    def prudent(writer: CheckpointWriter, model: torch.nn.Module, opt: torch.optim.Optimizer,
                rep: int) -> Any:
        """What the checkpointer does on the training thread, then the writer's save."""
        folder = checkpoint_name(rep) + ".shards"
        tensors, kept = dcp_entries(module_pairs({"model": model, "optimizer": opt},
                                                 saving=True), folder)
        return writer.save(rep, {"objects": kept}, {}, shards=folder, tensors=tensors)

    def prudent_sync(model: torch.nn.Module, opt: torch.optim.Optimizer,
                     rep: int) -> tuple[float, Callable[[], None]]:
        started = time.perf_counter()
        result = prudent(sync, model, opt, rep)
        assert result is not None and result.error is None, result
        return time.perf_counter() - started, lambda: None

    def prudent_async(model: torch.nn.Module, opt: torch.optim.Optimizer,
                      rep: int) -> tuple[float, Callable[[], None]]:
        started = time.perf_counter()
        prudent(asyn, model, opt, rep)
        blocked = time.perf_counter() - started

        def durable() -> None:
            asyn.wait()
            assert all(r.error is None for r in asyn.completed())
        return blocked, durable

    found = {"torch.save": torch_save, "prudent sync": prudent_sync, "prudent async": prudent_async}
    dcp = _dcp_async(folder)
    if dcp is not None:
        found["dcp.async_save"] = dcp
    return found


def _dcp_async(folder: Path) -> Save | None:
    try:
        import torch.distributed.checkpoint as dcp

        probe = dcp.async_save({"x": torch.zeros(4)}, checkpoint_id=str(folder / "dcp-probe"))
        probe.result()
    except Exception as exc:  # noqa: BLE001 - report and go on without it
        print(f"dcp.async_save not measured: {type(exc).__name__}: {exc}")
        return None

    def save(model: torch.nn.Module, opt: torch.optim.Optimizer,
             rep: int) -> tuple[float, Callable[[], None]]:
        started = time.perf_counter()
        future = dcp.async_save(state_of(model, opt), checkpoint_id=str(folder / f"dcp-{rep}"))
        return time.perf_counter() - started, lambda: future.result()
    return save


def measure(size_mb: int, reps: int) -> dict[str, Any]:
    model, opt = make_state(size_mb)
    state_mb = sum(t.numel() * t.element_size() for t in _tensors(state_of(model, opt))) / 1e6
    with tempfile.TemporaryDirectory(dir=os.environ.get("PRUDENT_BENCH_DIR")) as tmp:
        save_by = methods(Path(tmp))
        blocked: dict[str, list[float]] = {name: [] for name in save_by}
        for rep in range(reps + 1):  # the first repetition warms up (allocations, page cache)
            order = list(save_by)[rep % len(save_by):] + list(save_by)[:rep % len(save_by)]
            for name in order:
                step(model, opt)
                seconds, durable = save_by[name](model, opt, rep)
                durable()
                if rep:
                    blocked[name].append(seconds)
    medians = {name: statistics.median(v) for name, v in blocked.items()}
    return {"size_mb": round(state_mb), "median_blocked_s": medians, "blocked_s": blocked,
            "ratio_to_torch_save": {n: m / medians["torch.save"] for n, m in medians.items()}}


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[50, 200, 800])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default="benchmarks/results/checkpoint.json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    results = [measure(size, args.reps) for size in args.sizes_mb]
    table = Table(title="time the training loop is blocked per checkpoint (median)")
    names = list(results[0]["median_blocked_s"])
    table.add_column("state")
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        table.add_row(f"{r['size_mb']} MB", *[
            f"{r['median_blocked_s'][n] * 1000:.0f} ms ({r['ratio_to_torch_save'][n]:.2f}x)"
            for n in names])
    Console().print(table)
    machine = {"torch": torch.__version__, "python": platform.python_version(),
               "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "reps": args.reps}
    Console().print(f"machine: {machine}; ratios are to torch.save in the same repetition set")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"machine": machine, "results": results}, indent=2))


if __name__ == "__main__":
    main()
