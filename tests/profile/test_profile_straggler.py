"""StragglerWatch: the rule that names a slow rank, and the component inside a real run whose
peers are faked (the two-rank torchrun runs are in tests/e2e/test_straggler.py)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import prudent
from prudent.distributed.torchrun import Ranks
from prudent.kernel.events import Component
from prudent.profile import StragglerSettings, StragglerWatch
from prudent.profile.straggler import RankTimes, find_stragglers, straggler_finding
from prudent.store.database import Store
from prudent.testing import make_settings, tiny_model
from prudent.wiring.components import default_components

MS = 1e-3


def times(rank: int, busy_ms: float, wait_ms: float = 0.1, step_ms: float = 25.0,
          num_steps: int = 100) -> RankTimes:
    return RankTimes(rank, f"host-{'abcdefgh'[rank]}", 480, busy_ms * MS, wait_ms * MS,
                     step_ms * MS, num_steps)


def test_a_rank_slower_than_the_others_is_named_slowest_first() -> None:
    reports = [times(0, 1.1), times(1, 21.2), times(2, 1.0), times(3, 9.0)]
    found = find_stragglers(reports, StragglerSettings())
    assert [s.times.rank for s in found] == [1, 3]
    assert found[0].others_busy_s == pytest.approx(1.1 * MS)  # the median of ranks 0, 2, 3
    assert found[0].score == pytest.approx(1.1 / 21.2)


def test_ranks_alike_name_no_one() -> None:
    assert find_stragglers([times(0, 5.3), times(1, 5.0)], StragglerSettings()) == []


def test_one_unusually_fast_rank_makes_no_one_a_straggler() -> None:
    reports = [times(0, 1.0), times(1, 10.0), times(2, 10.2), times(3, 9.8)]
    assert find_stragglers(reports, StragglerSettings()) == []


def test_a_slower_rank_whose_excess_is_a_sliver_of_the_step_is_let_be() -> None:
    # 0.5 ms against 0.2 ms is a score of 0.4, but 0.3 ms of a 100 ms step slows nobody
    reports = [times(0, 0.2, step_ms=100), times(1, 0.5, step_ms=100)]
    assert find_stragglers(reports, StragglerSettings()) == []
    assert find_stragglers(reports, StragglerSettings(min_excess_pct=0.1))


def test_too_few_steps_timed_on_any_rank_judges_nothing() -> None:
    reports = [times(0, 1.0), times(1, 20.0, num_steps=5)]
    assert find_stragglers(reports, StragglerSettings(min_steps=20)) == []
    assert find_stragglers([times(0, 1.0)], StragglerSettings()) == []


def test_the_finding_names_rank_host_step_and_both_ranks_numbers() -> None:
    reports = [times(0, 1.1), times(1, 51.2)]
    finding = straggler_finding(find_stragglers(reports, StragglerSettings()), reports)
    assert finding.id == "straggler"
    assert finding.message.startswith(
        "rank 1 on host-b spends 51.2 ms per step outside collectives (data wait 0.1 ms), the "
        "other rank 1.1 ms (data wait 0.1 ms), at step 480: the whole job runs at its pace "
        "(25 ms a step). Check host-b: thermal throttling")
    assert finding.evidence["rank"] == 1 and finding.evidence["host"] == "host-b"
    assert (finding.evidence["busy_ms"], finding.evidence["others_busy_ms"]) == (51.2, 1.1)


def test_a_rank_slow_for_its_data_is_sent_to_its_data_path() -> None:
    reports = [times(0, 1.1, wait_ms=0.1), times(1, 30.0, wait_ms=28.0), times(2, 1.0)]
    finding = straggler_finding(find_stragglers(reports, StragglerSettings()), reports)
    assert "the other ranks' median 1.05 ms" in finding.message
    assert "Most of it is waiting for data: check rank 1's data path" in finding.message


class FakePeers(Component):
    """First STEP_END handler, as the stop coordinator is: every step is an agreed one, and
    the group's other rank reports ``peer_busy_ms`` outside collectives."""

    name = "fake_peers"

    def __init__(self, peer_busy_ms: float) -> None:
        self.peer_busy_ms = peer_busy_ms
        self.ranks = Ranks(0, 2)
        self.gathered: list[list[Any]] = []

    def on_start(self, run: Any) -> None:
        run.rank_group = self

    def on_step_end(self, run: Any, metrics: dict[str, Any]) -> None:
        run.ranks_agreed = True

    def all_gather(self, mine: RankTimes) -> list[Any]:
        peer = RankTimes(1, "host-b", mine.step, self.peer_busy_ms * MS, 0.0001, mine.step_s,
                         mine.num_steps)
        self.gathered.append([mine, peer])
        return [mine, peer]


def train_with_peer(home: Path, peer_busy_ms: float, steps: int = 60, interval_s: float = 0.2,
                    ) -> tuple[prudent.Run, FakePeers, str]:
    settings = make_settings(
        home, profile={"straggler": {"interval_s": interval_s, "min_steps": 5}},
        checkpoint={"enabled": False})
    peers, out = FakePeers(peer_busy_ms), io.StringIO()
    watch = StragglerWatch(settings.profile.straggler, stream=out)
    run = prudent.init(name="s", settings=settings, exit_on_stop=False, components=[peers, watch])
    weight = tiny_model(in_features=4)
    with run:
        for x in run.batches([torch.zeros(2, 4)] * steps):
            time.sleep(0.002)  # this rank's forward
            run.backward(weight(x).sum())
            run.step()
    return run, peers, out.getvalue()


def test_a_slow_peer_is_recorded_once_and_said_on_the_console(home: Path) -> None:
    run, peers, said = train_with_peer(home, peer_busy_ms=40.0)
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    findings = [e for e in store.events(run.id) if e["kind"] == "finding"]
    store.close()
    assert len(peers.gathered) >= 2  # compared again, recorded only when the rank became slow
    assert [(e["name"], e["payload"]["rank"], e["payload"]["host"]) for e in findings] == [
        ("straggler", 1, "host-b")]
    assert findings[0]["message"].startswith("rank 1 on host-b spends 40 ms per step")
    assert said.count("straggler: rank 1 on host-b") == 1


def test_comparisons_come_every_interval_not_every_step(home: Path) -> None:
    # the peer at 2.5 ms: this rank (a 2 ms sleep and the step's own work) is a straggler
    # only past 2.5 / relative_score (0.7) = 3.6 ms, the peer only below 1.75 ms, never
    _, peers, said = train_with_peer(home, peer_busy_ms=2.5, steps=150)
    steps = [pair[0].step for pair in peers.gathered]
    assert 2 <= len(steps) <= 20, steps  # ~150 steps of ~3 ms, compared every 0.2 s
    assert all(pair[0].num_steps >= 1 for pair in peers.gathered[1:])
    assert said == ""  # 2.5 ms against this rank's ~2.5-3 ms: no straggler


def test_only_a_distributed_run_gets_a_watch(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(home)
    assert not [c for c in default_components(settings) if isinstance(c, StragglerWatch)]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert [c for c in default_components(settings) if isinstance(c, StragglerWatch)]
    off = make_settings(home, profile={"straggler": {"enabled": False}})
    assert not [c for c in default_components(off) if isinstance(c, StragglerWatch)]


def test_an_interval_shorter_than_min_steps_steps_still_judges(home: Path) -> None:
    """1 ms between comparisons on ~3 ms steps: each comparison waits for min_steps (5)
    steps, so it judges (the torchrun straggler test once compared 11 times and judged 0)."""
    run, peers, said = train_with_peer(home, peer_busy_ms=40.0, interval_s=0.001)
    watch = next(c for c in run.context.components if isinstance(c, StragglerWatch))
    assert all(pair[0].num_steps >= 5 for pair in peers.gathered[1:]), peers.gathered
    assert watch.num_comparisons >= 5 and "straggler: rank 1 on host-b" in said
