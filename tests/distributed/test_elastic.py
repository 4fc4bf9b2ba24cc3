"""Elastic jobs: which errors mean another rank is gone, and the membership event."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from prudent.distributed.elastic import peer_lost, record_membership
from prudent.kernel.context import RunContext

GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
              "error [127.0.0.1]:5019: Connection reset by peer. This is typically caused by a "
              "remote worker hanging or bugs in the application.")


def test_a_collectives_error_about_a_gone_peer_is_a_lost_rank() -> None:
    assert peer_lost(RuntimeError(GLOO_RESET)) == GLOO_RESET
    assert peer_lost(dist.DistNetworkError("store gone")) == "store gone"


@pytest.mark.parametrize("error", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
    ConnectionResetError("Connection reset by peer"),  # the script's own socket: its bug
    ValueError("")])
def test_other_errors_are_the_scripts_failures(error: Exception) -> None:
    assert peer_lost(error) is None


def _events(tmp_path: Path, saved: list[str] | None, now: list[str]) -> list[dict]:
    run = RunContext(run_id="r", name="r", config={}, home=tmp_path, store=None,
                     handle_signals=False)
    recorded: list[dict] = []
    run.writer.put_event = recorded.append  # type: ignore[method-assign]
    run.state.step = 40
    record_membership(run, saved, now)
    return recorded


def test_a_machine_that_left_and_one_that_joined_are_named_with_the_world(tmp_path: Path) -> None:
    left = _events(tmp_path, ["node-a", "node-b"], ["node-a"])
    assert [e["message"] for e in left] == [
        "2 ranks on 2 machines -> 1 rank on 1 machine at step 40: node-b left"]
    assert json.loads(left[0]["payload"])["left"] == ["node-b"]
    joined = _events(tmp_path, ["node-a"], ["node-a", "node-c"])
    assert joined[0]["message"].endswith("node-c joined")
    assert json.loads(joined[0]["payload"])["world_size"] == 2


def test_the_same_world_records_nothing(tmp_path: Path) -> None:
    assert _events(tmp_path, ["a", "b"], ["a", "b"]) == []
    assert _events(tmp_path, None, ["a"]) == []  # a checkpoint without its world
