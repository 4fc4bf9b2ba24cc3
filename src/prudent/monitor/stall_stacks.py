"""Stall stacks per rank, each file saying whether its own rank is the hung one.

Under torchrun one hung rank (a dead data mount, a deadlock, a sleeping process) stalls every
rank: the others wait for it in the next collective (DDP's gradient all-reduce inside
backward, prudent's rank agreement, a barrier), so every rank's watchdog fires at about the
same time. The stack that matters is the hung rank's, so each rank writes its own file
(``stalled-stacks-rank{r}.txt``; ``stalled-stacks.txt`` in a single process: one file, no
verdict). The hung rank cannot take part in a collective, so nobody can ask it: each rank
judges its own main thread and writes the verdict as its file's first line. Rank 0, whose
events alone reach the record, then reads its peers' first lines in the run folder (those of
its node, or of every node on a shared file system) and names the hung rank in its event.

The verdict reads the innermost frame of the main thread only (a hung user forward is called
from DDP's forward, so the callers are not asked):

* *waits for its peers*: that frame is in ``torch.distributed``, DDP's module, a future of a
  communication hook or prudent's rank agreement, or it calls a ``Work``'s ``.wait()``; or it
  is the autograd engine: DDP all-reduces (FSDP reduce-scatters) gradients inside backward,
  and on a distributed job a backward that outlasts a stall timeout waits for a peer;
* *waits for its device*: it reads a tensor from the GPU (``.item()``, ``synchronize``): with
  NCCL the host of a healthy rank waits there while its GPU waits in the collective; the
  stack cannot tell that from a GPU that hangs;
* *the hung rank*: anywhere else.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prudent.distributed.torchrun import Ranks, ranks_from_env
from prudent.monitor.watchdog import dump_stacks

__all__ = ["PEER_WAIT_S", "RankStacks", "StallVerdict", "hung_peers", "judge_stack",
           "stacks_file"]

SINGLE_FILE = "stalled-stacks.txt"
PEER_WAIT_S = 5.0  # rank 0 waits this long at most for its peers' files (they fire together)
COLLECTIVE_CODE = ("torch/distributed/", "torch/nn/parallel/distributed.py", "torch/futures/",
                   "prudent/distributed/torchrun.py")
BACKWARD_CODE = ("torch/autograd/",)
DEVICE_CODE = ("torch/cuda/",)
_WORK_WAIT = re.compile(r"\.wait\(\s*\)")  # a Work's wait is C++: the caller's frame shows it
_COMMENT = re.compile(r"\s+#.*$")  # a source line's trailing comment (Python 3.12 shows it)
_DEVICE_READ = re.compile(r"\.(item|tolist|cpu|numpy)\(\s*\)|synchronize\(")
HUNG, PEERS, DEVICE = "hung", "peers", "device"
# the first line of a rank's file; rank 0 reads its peers' with _HUNG_LINE (one format, here)
_LINES = {
    HUNG: "rank {rank} of {world} is the hung rank: its main thread is not waiting for its "
          "peers ({where})",
    PEERS: "rank {rank} of {world} waits for its peers in a collective ({where}): not the "
           "hung rank",
    DEVICE: "rank {rank} of {world} waits for its device ({where}), which may itself wait for "
            "its peers in a collective (NCCL): not known to be the hung rank",
}
_HUNG_LINE = re.compile(r"^rank (\d+) of \d+ is the hung rank\b")


def stacks_file(ranks: Ranks) -> str:
    """``stalled-stacks-rank{r}.txt`` under torchrun, ``stalled-stacks.txt`` otherwise."""
    return f"stalled-stacks-rank{ranks.rank}.txt" if ranks.is_distributed else SINGLE_FILE


def judge_stack(stack: list[traceback.FrameSummary]) -> tuple[str, str]:
    """(HUNG, PEERS or DEVICE; where) for a main thread's stack, outermost frame first."""
    if not stack:
        return HUNG, "no Python frame"
    frame = stack[-1]
    path = frame.filename.replace(os.sep, "/")
    line = _COMMENT.sub("", frame.line or "").strip()
    place = f"{frame.name}, {'/'.join(path.split('/')[-2:])}:{frame.lineno}"
    where = f"{line[:80]} in {place}"
    if any(code in path for code in BACKWARD_CODE):
        return PEERS, f"in backward, where DDP reduces gradients: {place}"
    if any(code in path for code in COLLECTIVE_CODE) or _WORK_WAIT.search(line):
        return PEERS, where
    if any(code in path for code in DEVICE_CODE) or _DEVICE_READ.search(line):
        return DEVICE, where
    return HUNG, where


@dataclass(frozen=True)
class StallVerdict:
    """One rank's judgement of its own main thread, as its file's first line says it."""

    rank: int
    world_size: int
    kind: str  # HUNG, PEERS or DEVICE
    where: str

    @classmethod
    def of_main_thread(cls, ranks: Ranks) -> StallVerdict:
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
        kind, where = judge_stack(traceback.extract_stack(frame) if frame is not None else [])
        return cls(ranks.rank, ranks.world_size, kind, where)

    @property
    def line(self) -> str:
        return _LINES[self.kind].format(rank=self.rank, world=self.world_size, where=self.where)


def hung_peers(run_dir: Path, ranks: Ranks, since: float, wait_s: float,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """The peers whose file, written after ``since`` (wall clock: this stall's), says they
    are the hung rank; waits up to ``wait_s`` for one such file or every peer's."""
    deadline = clock() + wait_s
    while True:
        lines = _fresh_first_lines(run_dir, ranks, since)
        hung = sorted(r for r, line in lines.items() if _HUNG_LINE.match(line))
        if hung or len(lines) >= ranks.world_size - 1 or clock() >= deadline:
            return hung
        sleep(0.1)


def _fresh_first_lines(run_dir: Path, ranks: Ranks, since: float) -> dict[int, str]:
    lines = {}
    for rank in range(ranks.world_size):
        path = run_dir / stacks_file(Ranks(rank, ranks.world_size))
        try:
            if rank != ranks.rank and path.stat().st_mtime >= since:
                with path.open() as file:
                    lines[rank] = file.readline()
        except OSError:
            continue  # not written (yet), or on another node's disk
    return lines


class RankStacks:
    """This rank's stall stacks: its file, its verdict (judged when built: build it when the
    stall fires), what the finding says of them, and for rank 0 its peers' verdicts."""

    def __init__(self, run_dir: Path, since: float, ranks: Ranks | None = None) -> None:
        self.ranks = ranks or ranks_from_env()
        self.run_dir, self.since = run_dir, since
        self.path = run_dir / stacks_file(self.ranks)
        self.verdict = (StallVerdict.of_main_thread(self.ranks) if self.ranks.is_distributed
                        else None)

    def note(self) -> str:
        """The finding's words on this rank's stacks."""
        verdict, name = self.verdict, self.path.name
        if verdict is None:
            return f"stacks of every thread in {name}"
        if verdict.kind == HUNG:
            return f"{verdict.line}; stacks of every thread in {name}"
        return (f"{verdict.line}; the hung rank's own stalled-stacks-rank{{r}}.txt in its run "
                f"folder says 'is the hung rank' (this rank's stacks: {name})")

    def write(self, header: str) -> None:
        """Every thread's stack, the verdict first."""
        verdict = self.verdict
        dump_stacks(self.path, header if verdict is None else f"{verdict.line}\n{header}")

    def peers_note(self, wait_s: float = PEER_WAIT_S) -> str | None:
        """On rank 0 when it only waits: the finding's words naming the hung rank from its
        peers' files (None on other ranks, or when rank 0 is the hung one)."""
        verdict = self.verdict
        if verdict is None or verdict.kind == HUNG or not self.ranks.is_main:
            return None
        hung = hung_peers(self.run_dir, self.ranks, self.since, wait_s)
        if not hung:
            return self.note()
        named = ", ".join(f"rank {r} (stalled-stacks-rank{r}.txt)" for r in hung)
        return (f"{verdict.line}; the hung rank: {named}, whose main thread is not waiting "
                f"for its peers (this rank's stacks: {self.path.name})")
