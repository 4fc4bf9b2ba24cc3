"""Per-rank state in a checkpoint: each rank gets its own part back, and an epoch's position,
counted in global samples, moves to any other number of ranks: the rest of the epoch is dealt
over the new world, every sample once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from prudent.checkpoint.ranks import check_world_change, rank_state, restore_rank_state, world_of
from prudent.distributed.torchrun import Ranks
from prudent.kernel.context import RunContext
from prudent.kernel.data import continue_epoch_at, shards_by_rank


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


def test_a_world_change_is_recorded_with_the_samples_already_trained(tmp_path: Path) -> None:
    run = context(tmp_path)
    run.state.batches_in_epoch, run.state.batch_size = 5, 4  # 5 batches of 4 on each of 4 ranks
    recorded: list[dict] = []
    run.writer.put_event = recorded.append  # type: ignore[method-assign]
    check_world_change(run, 4, 3)
    assert [e["name"] for e in recorded] == ["world_changed"]
    assert recorded[0]["message"] == ("checkpoint taken on 4 ranks, resumed on 3; 80 samples of "
                                      "epoch 1 already trained, the rest of it dealt over 3 ranks")
    assert run.state.batches_in_epoch == 5  # run.batches deals the rest, seeing the loader


def _loader(dataset: TensorDataset, world: int, rank: int, drop_last: bool = False) -> DataLoader:
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=5)
    sampler.set_epoch(3)
    return DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=drop_last)


def _segment(loaders: list, num_batches: int | None) -> list[list[int]]:
    """Each rank's first ``num_batches`` batches (all of them: None), as sample indices."""
    taken = []
    for loader in loaders:
        batches = [batch[0].tolist() for batch in loader]
        taken.append(batches[:num_batches])
    assert len({len(b) for b in taken}) == 1, "the ranks would take different numbers of steps"
    return taken


def test_an_epoch_begun_on_four_ranks_goes_on_on_three_then_two_each_sample_once() -> None:
    dataset = TensorDataset(torch.arange(256))
    trained = _segment([_loader(dataset, 4, r) for r in range(4)], 5)  # 80 samples
    calls = []
    three = [continue_epoch_at(_loader(dataset, 3, r), 80, lambda: calls.append(1))
             for r in range(3)]
    trained += _segment(three, 7)  # 7 batches of 4 on 3 ranks: 84 more, 164 in all
    trained += _segment([continue_epoch_at(_loader(dataset, 2, r), 164, lambda: None)
                         for r in range(2)], None)
    seen = sorted(i for rank in trained for batch in rank for i in batch)
    assert seen == list(range(256))  # every sample of the epoch exactly once
    assert calls == [1, 1, 1]  # the checkpoint's generators back before any data is loaded
    # the epoch's order is the sampler's: the first 80 are what 4 ranks of it trained
    whole = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=5)
    whole.set_epoch(3)
    assert sorted(list(whole)[:80]) == sorted(i for r in trained[:4] for b in r for i in b)


def test_a_rest_that_would_give_a_rank_a_step_fewer_is_padded_as_the_sampler_pads() -> None:
    dataset = TensorDataset(torch.arange(25))
    # 16 trained, 9 left for 2 ranks: 5 and 4 samples would be 2 steps and 1
    rest = _segment([continue_epoch_at(_loader(dataset, 2, r), 16, lambda: None)
                     for r in range(2)], None)
    counts = Counter(i for rank in rest for batch in rank for i in batch)
    assert set(counts) == set(_order(dataset)[16:]) and sorted(counts.values()) == [1] * 8 + [2]
    # with the loader's drop_last the short batches go instead: no step fewer, none padded
    cut = _segment([continue_epoch_at(_loader(dataset, 2, r, drop_last=True), 16, lambda: None)
                    for r in range(2)], None)
    assert [len(rank) for rank in cut] == [1, 1]


def _order(dataset: TensorDataset) -> list[int]:
    whole = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=5)
    whole.set_epoch(3)
    return list(whole)


def test_a_loader_without_a_distributed_sampler_cannot_be_continued_elsewhere() -> None:
    dataset = TensorDataset(torch.arange(16))
    assert continue_epoch_at(DataLoader(dataset, batch_size=2, shuffle=True), 4,
                             lambda: None) is None


def test_only_a_distributed_sampler_carries_a_position_across_worlds() -> None:
    dataset = TensorDataset(torch.arange(16))
    shared = DataLoader(dataset, batch_size=2,
                        sampler=DistributedSampler(dataset, num_replicas=2, rank=0))
    assert shards_by_rank(shared)
    assert not shards_by_rank(DataLoader(dataset, batch_size=2, shuffle=True))
