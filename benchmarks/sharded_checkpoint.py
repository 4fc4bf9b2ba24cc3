"""How long a checkpoint stops the training loop on each rank: ~200 MB of state, 2 ranks.

Three ways, in one torchrun job, each repeated and timed on every rank:

- ``rank0``: prudent's writer on rank 0 with a DDP model (every rank holds all of it; rank 0
  takes its state dicts through DCP's state-dict API and copies their tensors to host memory,
  a background thread writes them as DCP shards, once): what DDP runs use;
- ``dcp``: ``torch.distributed.checkpoint.save`` of an FSDP2 model's and optimizer's shards,
  every rank writing its own (what prudent does for sharded state): the loop waits for the
  whole write;
- ``dcp_async``: ``dcp.async_save`` of the same shards on a gloo group of its own: the loop
  waits for the copy to host memory; the write goes on in a background thread.

The stall is the training thread's wait (median over reps, after a first save that allocates
what the next ones reuse); "done" is until the files are complete. Reproduce (launches torchrun itself; CPU, gloo)::

    python benchmarks/sharded_checkpoint.py             # ~200 MB of state, 3 reps, ~1 min
    python benchmarks/sharded_checkpoint.py --width 2048 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchrun_job import RESULT_ENV, run_as_job  # noqa: E402

MODES = ("rank0", "dcp", "dcp_async")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1440, help="hidden width of the MLP")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--json", default="benchmarks/results/sharded_checkpoint.json")
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as folder:
        run_as_job(__file__, args.ranks, {**os.environ, "BENCH_DIR": folder}, args.json, report)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    folder = Path(os.environ["BENCH_DIR"])
    timings: dict[str, dict[str, list[float]]] = {m: {"stall": [], "done": []} for m in MODES}
    state_mb: dict[str, float] = {}
    for mode in MODES:
        saves, state_mb[mode] = SAVES[mode](args, folder / mode, args.reps + 1)
        for stall, done in saves[1:]:  # the first allocates what the next ones reuse
            timings[mode]["stall"].append(stall)
            timings[mode]["done"].append(done)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, timings)
    if dist.get_rank() == 0:
        result = {"width": args.width, "layers": args.layers, "reps": args.reps,
                  "ranks": args.ranks, "state_mb": state_mb, "cores": os.cpu_count(),
                  "per_rank": [{m: {k: statistics.median(v) for k, v in t[m].items()}
                                for m in MODES} for t in everyone]}
        Path(os.environ[RESULT_ENV]).write_text(json.dumps(result))
    dist.destroy_process_group()


def _model(args: argparse.Namespace) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = [nn.Linear(args.width, args.width) for _ in range(args.layers)]
    return nn.Sequential(*layers)


def _trained(model: Any) -> Any:
    """AdamW after one step: its two moments exist (the state is 3x the parameters)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    width = next(model.parameters()).shape[-1]
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return optimizer


def _megabytes(tensors: Any) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 1e6


def save_rank0(args: argparse.Namespace, folder: Path,
               reps: int) -> tuple[list[tuple[float, float]], float]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from prudent.checkpoint.sharded import dcp_entries, module_pairs
    from prudent.checkpoint.storage import LocalStorage, checkpoint_name
    from prudent.checkpoint.writer import CheckpointWriter

    model = DistributedDataParallel(_model(args))
    optimizer = _trained(model)
    megabytes = _megabytes([*model.parameters()]) * 3
    writer = CheckpointWriter(LocalStorage(folder), keep=1, asynchronous=True)
    saves = []
    for step in range(1, reps + 1):
        dist.barrier()
        started = time.perf_counter()
        stall = done = 0.0
        if dist.get_rank() == 0:
            shards = checkpoint_name(step) + ".shards"  # what the checkpointer does
            tensors, kept = dcp_entries(module_pairs({"model": model, "optimizer": optimizer},
                                                     saving=True), shards)
            writer.save(step, {"objects": kept}, {"run_id": "bench"}, shards=shards,
                        tensors=tensors)
            stall = time.perf_counter() - started
            writer.wait()
            done = time.perf_counter() - started
        saves.append((stall, done))
    dist.barrier()
    return saves, megabytes


def _sharded(args: argparse.Namespace) -> tuple[Any, Any, float]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model(args)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = _trained(model)
    megabytes = _megabytes([p.to_local() for p in model.parameters()]) * 3 * dist.get_world_size()
    return model, optimizer, megabytes


def _shards(model: Any, optimizer: Any) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(
        model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
    tensors = {f"model/{k}": v for k, v in model_state.items()}
    tensors.update({f"optimizer/{k}": v for k, v in optimizer_state.items()
                    if isinstance(v, torch.Tensor)})
    return tensors


def save_dcp(args: argparse.Namespace, folder: Path, reps: int,
             asynchronous: bool = False) -> tuple[list[tuple[float, float]], float]:
    """Each rank's shards through dcp.save, or dcp.async_save (the loop's wait is then the
    copy to host memory; "done" waits for the write)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    model, optimizer, megabytes = _sharded(args)
    group = dist.new_group(backend="gloo")
    save = dcp.async_save if asynchronous else dcp.save
    saves = []
    for rep in range(reps):
        dist.barrier()
        started = time.perf_counter()
        future = save(_shards(model, optimizer), checkpoint_id=str(folder / f"ckpt-{rep}"),
                      process_group=group)
        stall = time.perf_counter() - started
        if asynchronous:
            future.result()
        saves.append((stall, time.perf_counter() - started))
    dist.barrier()
    return saves, megabytes


SAVES = {"rank0": save_rank0, "dcp": save_dcp,
         "dcp_async": lambda args, folder, reps: save_dcp(args, folder, reps, asynchronous=True)}


def report(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"checkpoint stall per rank, {result['ranks']} ranks, "
                  f"median of {result['reps']} (CPU, gloo, {result['cores']} cores)")
    for column in ("way", "state MB", *(f"rank {r} stall / done s"
                                        for r in range(result["ranks"]))):
        table.add_column(column, justify="left" if column == "way" else "right")
    for mode in MODES:
        cells = [f"{rank[mode]['stall']:.2f} / {rank[mode]['done']:.2f}"
                 for rank in result["per_rank"]]
        table.add_row(mode, f"{result['state_mb'][mode]:.0f}", *cells)
    Console().print(table)


if __name__ == "__main__":
    main()
