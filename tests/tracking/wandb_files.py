"""Reads an offline W&B run back from its ``run-<id>.wandb`` file.

wandb 0.31 ships no Python reader for it (``wandb.sdk.internal.datastore`` is gone, and
``wandb.Api`` only reads the server), so this reads the format itself: a 7-byte header
(``:W&B``, magic, version), then LevelDB-log style blocks of 32 KiB holding records (crc32,
length, type: full / first / middle / last), each a ``wandb.proto`` ``Record``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What one offline attempt wrote: W&B run id, history rows by step, config, summary."""

    run_id: str
    history: dict[int, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    files: list[str] = field(default_factory=list)


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    out, parts, pos = [], [], _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if (length, kind) == (0, 0):
            pos += left
            continue
        parts.append(data[pos + _HEADER:pos + _HEADER + length])
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            out.append(record)
            parts = []
    return out


def _set(into: dict[str, Any], item: Any) -> None:
    """``key``, or ``nested_key`` (a path: a table's fields sit under its name)."""
    *parents, last = [item.key] if item.key else list(item.nested_key)
    for name in parents:
        into = into.setdefault(name, {})
    into[last] = json.loads(item.value_json)


def read_run(path: Path) -> OfflineRun:
    run = OfflineRun(run_id="")
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            _apply(run.config, record.run.config.update)
        elif kind == "config":
            _apply(run.config, record.config.update)
        elif kind == "history":
            row: dict[str, Any] = {}
            _apply(row, record.history.item)
            run.history[record.history.step.num] = row
        elif kind == "summary":
            _apply(run.summary, record.summary.update)
        elif kind == "files":
            run.files += [f.path for f in record.files.files]
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def _apply(into: dict[str, Any], items: Any) -> None:
    for item in items:
        _set(into, item)


def offline_runs(wandb_dir: Path, timeout_s: float = 30.0) -> list[OfflineRun]:
    """Every offline attempt under ``wandb_dir``, oldest first (each relaunch offline is a new
    folder of the same W&B run id; ``wandb sync`` joins them). ``finish()`` returns before
    W&B's service has written the file out (seen: a file with no record yet), so each is
    read again until its exit record is there, for at most ``timeout_s``."""
    import time

    files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + timeout_s
    runs = []
    for path in files:
        run = read_run(path)
        while run.exit_code is None and time.monotonic() < deadline:
            time.sleep(0.1)
            run = read_run(path)
        runs.append(run)
    return runs
