"""Nodes and GPUs from torchrun's environment: the meter prices every node without --nodes,
and the policy counts the GPUs the processes use, not every GPU of the instance type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import prudent
from prudent.cost import CostMeter
from prudent.cost.catalog import load_catalog
from prudent.cost.policy import Job, check_job
from prudent.cost.settings import CostSettings, PolicySettings
from prudent.cost.shape import TorchrunShape, torchrun_shape, with_torchrun
from prudent.store.database import Store
from prudent.testing import FakeClock, make_settings

CATALOG = load_catalog(CostSettings(skypilot_catalogs=False))  # the bundled prices only
G5 = CATALOG.lookup("aws:g5.xlarge")  # 1 x A10G
P4D = CATALOG.lookup("aws:p4d.24xlarge")  # 8 x A100


def torchrun_env(nodes: int, per_node: int) -> dict[str, str]:
    """What torchrun sets for every worker (with other variables it sets, unread here)."""
    return {"GROUP_WORLD_SIZE": str(nodes), "LOCAL_WORLD_SIZE": str(per_node),
            "WORLD_SIZE": str(nodes * per_node), "RANK": "0", "LOCAL_RANK": "0",
            "GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": "none"}


def on_gpu() -> bool:
    return True


def on_cpu() -> bool:
    return False


def never_asked() -> bool:
    raise AssertionError("asked whether the job runs on GPUs outside torchrun")


def test_the_shape_is_read_only_from_torchrun_variables() -> None:
    assert torchrun_shape(torchrun_env(2, 4)) == TorchrunShape(2, 8, 4)
    assert torchrun_shape({}) is None
    assert torchrun_shape({"WORLD_SIZE": "4", "RANK": "0"}) is None  # not torchrun's agent
    assert torchrun_shape({"GROUP_WORLD_SIZE": "two", "LOCAL_WORLD_SIZE": "1"}) is None
    assert torchrun_shape({"GROUP_WORLD_SIZE": "0", "LOCAL_WORLD_SIZE": "1"}) is None


def test_outside_torchrun_the_job_is_unchanged() -> None:
    job = Job(instance=P4D)
    assert with_torchrun(job, CostSettings(), {}, never_asked) == (job, {})
    assert job.num_gpus == 8  # one process on a p4d: the instance's GPUs, as before


def test_nodes_come_from_torchrun_when_not_set_and_price_every_node() -> None:
    job, inferred = with_torchrun(Job(instance=G5), CostSettings(), torchrun_env(2, 1), on_cpu)
    assert job.nodes == 2 and job.hourly_usd == pytest.approx(2 * G5.on_demand_usd)
    assert inferred["nodes_from"] == "torchrun" and inferred["shape"] == "2 nodes (from torchrun)"
    assert inferred["torchrun"] == {"nodes": 2, "processes": 2, "processes_per_node": 1}


@pytest.mark.parametrize("nodes", [1, 3])
def test_an_explicit_nodes_setting_overrides_torchrun(nodes: int) -> None:
    cost = CostSettings.model_validate({"nodes": nodes})  # as --nodes, PRUDENT_NODES or yaml
    job, inferred = with_torchrun(Job(instance=G5, nodes=nodes), cost, torchrun_env(2, 1), on_cpu)
    assert job.nodes == nodes and inferred["nodes_from"] == "settings"
    assert inferred["shape"] == f"{nodes} node{'s' * (nodes > 1)} (cost.nodes; torchrun started 2)"


def test_on_gpus_the_policy_counts_the_processes_not_the_instance_type() -> None:
    job, inferred = with_torchrun(Job(instance=P4D), CostSettings(), torchrun_env(2, 2), on_gpu)
    assert job.num_gpus == 4 and inferred["gpus_from"] == "processes"  # not 2 x 8 = 16
    assert inferred["shape"] == "2 nodes (from torchrun), 4 GPUs (2 processes per node)"
    assert check_job(PolicySettings(max_gpus_per_job=4), job, catalog=CATALOG) == []
    (broken,) = check_job(PolicySettings(max_gpus_per_job=2), job, catalog=CATALOG)
    assert broken.message.startswith("4 GPUs exceed policy max_gpus_per_job=2")


def test_more_processes_than_gpus_share_them_and_are_counted_as_the_gpus_there_are() -> None:
    job, inferred = with_torchrun(Job(instance=G5), CostSettings(), torchrun_env(1, 4), on_gpu)
    assert job.num_gpus == 1
    assert inferred["shape"] == ("1 node (from torchrun), 1 GPU (4 processes per node, "
                                 "sharing the 1 of aws:g5.xlarge)")


def test_on_cpus_or_with_gpus_given_the_gpu_count_is_kept() -> None:
    cpu, inferred = with_torchrun(Job(instance=P4D), CostSettings(), torchrun_env(2, 2), on_cpu)
    assert cpu.num_gpus == 16 and inferred["gpus_from"] == "instance"  # as before, x 2 nodes
    given, _ = with_torchrun(Job(instance=P4D, gpus=3), CostSettings(), torchrun_env(2, 2), on_gpu)
    assert given.num_gpus == 3
    unknown, _ = with_torchrun(Job(), CostSettings(), torchrun_env(2, 4), on_gpu)
    assert unknown.num_gpus == 8  # no instance type known: one GPU per process


PRICEY = "cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n" \
         "test,pricey8,lab,A100,8,96,1024,3600,900,2026-12-01\n"  # $1 a second per node


def _metered_run(home: Path, environ: dict[str, str], **cost: Any) -> tuple[prudent.Run, FakeClock]:
    prices = home.parent / "prices.csv"
    prices.write_text(PRICEY)
    settings = make_settings(home, cost={"stop_margin": "0s", "detect": "off",
                                         "instance": "test:pricey8", "catalog_file": str(prices),
                                         **cost},
                             policy={"max_gpus_per_job": 4})
    clock = FakeClock()
    meter = CostMeter(settings.cost, quiet=True, clock=clock, environ=environ, on_gpu=on_gpu)
    run = prudent.init(name="shape", settings=settings, components=[meter], exit_on_stop=False)
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(range(10)):
                clock.advance(1.0)
                run.step(loss=1.0)
    return run, clock


def _events(home: Path, run_id: str, name: str) -> list[dict[str, Any]]:
    store = Store.open(make_settings(home).store)
    try:
        return [e for e in store.events(run_id) if e["name"] == name]
    finally:
        store.close()


def test_the_meter_prices_torchruns_nodes_and_says_where_they_came_from(home: Path) -> None:
    run, _ = _metered_run(home, torchrun_env(2, 2))
    assert run.stop_reason is None  # 4 GPUs used: within the policy, though 2 x 8 are there
    (price,) = _events(home, run.id, "price")
    assert "x 2 nodes)" in price["message"]
    assert "2 nodes (from torchrun), 4 GPUs (2 processes per node)" in price["message"]
    payload = price["payload"]
    assert (payload["nodes"], payload["gpus"], payload["nodes_from"]) == (2, 4, "torchrun")
    (meter,) = _events(home, run.id, "meter")
    assert meter["payload"]["total_usd"] == pytest.approx(20.0)  # 10 s x $1/s x 2 nodes


def test_the_meters_policy_check_sees_the_processes_and_an_explicit_nodes_wins(home: Path) -> None:
    run, _ = _metered_run(home, torchrun_env(1, 8), nodes=1)
    assert (run.stop_reason, run.state.step) == ("policy", 0)  # 8 processes on 8 GPUs > 4
    (price,) = _events(home, run.id, "price")
    assert price["payload"]["nodes_from"] == "settings"


@pytest.mark.parametrize(("command", "expected"), [
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "train.py"], ("2", "4", "8")),
    (["python", "-m", "torch.distributed.run", "--nnodes=1:3", "--nproc_per_node=2", "t.py"],
     ("3", "2", "6")),
    (["torchrun", "--standalone", "--nproc-per-node", "8", "train.py"], ("1", "8", "8")),
])
def test_a_torchrun_command_line_is_sized_as_its_workers_will_be(
        command: list[str], expected: tuple[str, str, str]) -> None:
    from prudent.cost.shape import torchrun_environ

    shape = torchrun_environ(command)
    assert (shape["GROUP_WORLD_SIZE"], shape["LOCAL_WORLD_SIZE"], shape["WORLD_SIZE"]) == expected


def test_other_commands_and_gpu_per_node_are_left_to_the_workers() -> None:
    from prudent.cost.shape import torchrun_environ

    assert torchrun_environ(["python", "train.py", "--nnodes", "2"]) == {}
    assert torchrun_environ(["torchrun", "--nproc-per-node", "gpu", "train.py"]) == {}
