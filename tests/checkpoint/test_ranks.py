"""Per-rank state in a checkpoint: each rank gets its own part back, and an epoch's position
moves to another number of ranks only when the ranks can split it evenly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from prudent.checkpoint.ranks import check_world_change, rank_state, restore_rank_state, world_of
from prudent.context import RunContext
from prudent.data import shards_by_rank
from prudent.distributed import Ranks
from prudent.errors import ConfigError


def context(tmp_path: Path) -> RunContext:
    return RunContext(run_id="r", name="r", config={}, home=tmp_path, store=None,
                      handle_signals=False)


def test_each_rank_takes_its_own_generators_back_not_rank_zeros(tmp_path: Path) -> None:
    run = context(tmp_path)
    parts = []
    for seed in (10, 11):  # two ranks seeded apart, as nanoGPT does (1337 + rank)
        torch.manual_seed(seed)
        parts.append(rank_state(run))
    restore_rank_state(run, {"ranks": parts}, Ranks(rank=1, world_size=2))
    assert torch.equal(run.resume_rng["torch"], parts[1]["rng"]["torch"])
    assert not torch.equal(run.resume_rng["torch"], parts[0]["rng"]["torch"])


def test_a_rank_the_checkpoint_did_not_have_keeps_the_scripts_streams(tmp_path: Path) -> None:
    run = context(tmp_path)
    parts = [rank_state(run), rank_state(run)]
    restore_rank_state(run, {"ranks": parts}, Ranks(rank=3, world_size=4))
    assert run.resume_rng == {}  # restores nothing, but still repositions the epoch


def test_world_of_counts_nodes_by_host() -> None:
    world = world_of([{"host": "a"}, {"host": "a"}, {"host": "b"}, {"host": "b"}])
    assert world == {"world_size": 4, "num_nodes": 2, "hosts": ["a", "a", "b", "b"]}


def test_four_ranks_position_becomes_two_ranks_position(tmp_path: Path) -> None:
    run = context(tmp_path)
    run.state.batches_in_epoch = 5  # 5 batches on each of 4 ranks: 20 of the epoch
    check_world_change(run, 4, 2)
    assert run.state.batches_in_epoch == 10


def test_a_position_the_new_world_cannot_split_evenly_is_refused(tmp_path: Path) -> None:
    run = context(tmp_path)
    run.state.batches_in_epoch = 5
    with pytest.raises(ConfigError, match=r"20 batches already trained .* over 3 ranks.*"
                                          r"divides 20 \(2, 4, 5, 10\)"):
        check_world_change(run, 4, 3)


def test_only_a_distributed_sampler_carries_a_position_across_worlds() -> None:
    dataset = TensorDataset(torch.arange(16))
    shared = DataLoader(dataset, batch_size=2,
                        sampler=DistributedSampler(dataset, num_replicas=2, rank=0))
    assert shards_by_rank(shared)
    assert not shards_by_rank(DataLoader(dataset, batch_size=2, shuffle=True))
