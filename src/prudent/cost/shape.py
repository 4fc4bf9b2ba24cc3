"""The job's size as torchrun tells every worker: nodes and processes, for the meter and policy.

torchrun sets ``GROUP_WORLD_SIZE`` (the agents in the rendezvous: one per node),
``LOCAL_WORLD_SIZE`` (processes on this node) and ``WORLD_SIZE`` (all processes). Without
them a 2-node job was priced as one node unless the user repeated ``--nodes 2``, and the
policy counted every GPU of the instance type (8 on a p4d for a 2-process job). An explicit
``cost.nodes`` (``--nodes``, ``PRUDENT_NODES``, prudent.yaml) stays the override. On GPUs
each process uses one GPU, and a node has no more GPUs than its instance type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prudent.cost.policy import Job
from prudent.cost.settings import CostSettings

__all__ = ["TorchrunShape", "torchrun_environ", "torchrun_shape", "with_torchrun"]


@dataclass(frozen=True)
class TorchrunShape:
    """How many nodes and processes torchrun started."""

    num_nodes: int
    num_processes: int
    processes_per_node: int


def torchrun_shape(environ: Mapping[str, str]) -> TorchrunShape | None:
    """The shape torchrun gave this worker, or None when torchrun did not start it."""
    try:
        nodes = int(environ["GROUP_WORLD_SIZE"])
        per_node = int(environ["LOCAL_WORLD_SIZE"])
        world = int(environ.get("WORLD_SIZE", nodes * per_node))
    except (KeyError, ValueError):
        return None
    if min(nodes, per_node, world) < 1:
        return None
    return TorchrunShape(nodes, world, per_node)


def torchrun_environ(command: Sequence[str]) -> dict[str, str]:
    """The shape a torchrun command line will give its workers, as the environment they will
    see (empty for any other command): for the policy's check before anything is launched,
    which cannot read the workers' environment. ``--nnodes MIN:MAX`` counts MAX machines, the
    most the job can hold; ``--nproc-per-node gpu``/``auto`` is left to the workers."""
    if not any(Path(part).name in ("torchrun",) or part == "torch.distributed.run"
               for part in command):
        return {}
    nodes, per_node = _option(command, "--nnodes") or "1", _option(command, "--nproc-per-node")
    if "--standalone" in command:
        nodes = "1"
    try:
        num_nodes, num_per_node = int(nodes.rsplit(":", 1)[-1]), int(per_node or "1")
    except ValueError:
        return {}
    return {"GROUP_WORLD_SIZE": str(num_nodes), "LOCAL_WORLD_SIZE": str(num_per_node),
            "WORLD_SIZE": str(num_nodes * num_per_node)}


def _option(command: Sequence[str], name: str) -> str | None:
    """``--name value``, ``--name=value`` or its underscore spelling, the last one given."""
    spellings = (name, name.replace("-", "_").replace("__", "--"))
    found = None
    for i, part in enumerate(command):
        if part in spellings and i + 1 < len(command):
            found = command[i + 1]
        elif part.split("=", 1)[0] in spellings and "=" in part:
            found = part.split("=", 1)[1]
    return found


def with_torchrun(job: Job, cost: CostSettings, environ: Mapping[str, str],
                  on_gpu: Callable[[], bool]) -> tuple[Job, dict[str, Any]]:
    """``job`` with torchrun's nodes (unless set) and, when ``on_gpu()`` (asked only under
    torchrun), the GPUs its processes use; and what was inferred, for the cost events (empty
    when torchrun did not start this process)."""
    shape = torchrun_shape(environ)
    if shape is None:
        return job, {}
    explicit = "nodes" in cost.model_fields_set
    nodes = job.nodes if explicit else shape.num_nodes
    per_node = _gpus_per_node(job, shape) if job.gpus is None and on_gpu() else None
    job = replace(job, nodes=nodes, gpus=job.gpus if per_node is None else per_node * nodes)
    return job, {"nodes_from": "settings" if explicit else "torchrun",
                 "gpus_from": "instance" if per_node is None else "processes",
                 "torchrun": {"nodes": shape.num_nodes, "processes": shape.num_processes,
                              "processes_per_node": shape.processes_per_node},
                 "shape": _describe(job, shape, explicit, per_node)}


def _gpus_per_node(job: Job, shape: TorchrunShape) -> int:
    """One GPU per process, at most the instance type's (more processes share them)."""
    has = job.instance.num_gpus if job.instance is not None else 0
    return min(shape.processes_per_node, has) if has else shape.processes_per_node


def _describe(job: Job, shape: TorchrunShape, explicit: bool, per_node: int | None) -> str:
    """``2 nodes (from torchrun), 4 GPUs (2 processes per node)``, for a person."""
    source = "from torchrun"
    if explicit:
        source = "cost.nodes" + (f"; torchrun started {shape.num_nodes}"
                                 if job.nodes != shape.num_nodes else "")
    text = f"{_count(job.nodes, 'node')} ({source})"
    if per_node is None:
        return text
    shared = (f", sharing the {per_node} of {job.instance.ref}"
              if job.instance is not None and per_node < shape.processes_per_node else "")
    return (f"{text}, {_count(job.num_gpus, 'GPU')} "
            f"({_count(shape.processes_per_node, 'process')} per node{shared})")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 'es' if noun.endswith('s') else 's'}"
