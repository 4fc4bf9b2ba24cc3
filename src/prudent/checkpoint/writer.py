"""Saving and loading checkpoints safely.

Saving: the training thread takes a snapshot (tensors copied to host memory, so the next
optimizer step cannot change what is written); a finiteness check (a snapshot holding NaN/inf
is never committed, see ``finite.py``), writing the models' and optimizers' tensors as DCP
shards (``sharded.py``) and the rest as ``state.pt``, fsync, commit, a read-back checksum
check and retention run on a background thread, one save in flight at a time (a
second save waits for the first: memory stays bounded to one snapshot). In sync mode
the same steps run on the caller's thread. Loading: newest first; a checkpoint whose manifest
is missing, whose checksum differs, or that the deserialiser rejects (the error a truncated
file gives differs between torch versions, so any exception counts) is skipped for the next
older one. Everything is loaded with ``weights_only=True``: no code from a file ever runs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from prudent.checkpoint.deferred import DeferredFile, resolve
from prudent.checkpoint.deferred import snapshot as snapshot_deferred
from prudent.checkpoint.finite import first_non_finite
from prudent.checkpoint.sharded import (
    SHARDS_SUFFIX,
    corrupted_shards,
    missing_shards,
    shard_digests,
    write_shards,
)
from prudent.checkpoint.storage import CheckpointStorage, LocalStorage, checkpoint_name, step_of

__all__ = ["CheckpointWriter", "LoadedCheckpoint", "SaveResult", "host_copy", "load_checkpoint",
           "load_latest"]

STATE_FILE = "state.pt"
# the writer's thread waits this long for the next save, then ends (saves further apart than
# this start a thread each: ~2 ms of a save that comes seconds after the last one)
_WORKER_IDLE_S = 2.0
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


@dataclass
class SaveResult:
    name: str
    step: int
    path: str = ""
    num_bytes: int = 0
    stall_s: float = 0.0
    write_s: float = 0.0
    error: str | None = None
    deleted: list[str] = field(default_factory=list)
    not_finite: str | None = None  # the tensor holding NaN/inf: the checkpoint was not kept


@dataclass
class LoadedCheckpoint:
    name: str
    payload: dict[str, Any]
    skipped: list[tuple[str, str]]  # (name, why) of newer checkpoints that could not be used
    shards: dict[str, dict[str, Any]] = field(default_factory=dict)  # file -> sha256, bytes
    shards_checked: bool = False  # every shard file's hash was checked (written by one process)


def host_copy(obj: Any) -> Any:
    """A deep copy whose tensors live in host memory and share nothing with the originals."""
    return SnapshotBuffers().copy(obj)


class SnapshotBuffers:
    """Host tensors reused from one snapshot to the next.

    Copying into memory that is already mapped is several times faster than allocating it
    anew (a fresh 200 MB allocation spends most of its time in page faults), and it is what
    keeps the training loop's stall small. Costs one extra copy of the state in host memory,
    like DCP's cached staging buffers. Safe because a new snapshot starts only after the
    previous one was written.
    """

    PARALLEL_BYTES = 64 * 2**20  # above this, copy with several threads (copy_ frees the GIL)

    def __init__(self, num_threads: int | None = None) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._pinned = torch.cuda.is_available()
        self.num_threads = num_threads or min(4, os.cpu_count() or 1)

    def copy(self, obj: Any) -> Any:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        copied = self._plan(obj, (), pairs)
        total = sum(src.numel() * src.element_size() for src, _ in pairs)
        if total < self.PARALLEL_BYTES or self.num_threads < 2:
            _copy_all(pairs)
        else:  # largest first, dealt round-robin: threads finish at about the same time
            pairs.sort(key=lambda pair: pair[0].numel() * pair[0].element_size(), reverse=True)
            with ThreadPoolExecutor(self.num_threads) as pool:
                list(pool.map(_copy_all, [pairs[i::self.num_threads] for i in range(self.num_threads)]))
        return copied

    def _plan(self, obj: Any, path: tuple[Any, ...], pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """The copy's structure, with a host buffer for each tensor (copied afterwards)."""
        if isinstance(obj, torch.Tensor):
            buffer = self._buffer(obj, path)
            pairs.append((obj.detach(), buffer))
            return buffer
        if isinstance(obj, DeferredFile):  # its tensors copied now, its bytes made by the writer
            return snapshot_deferred(obj, lambda tensor, at: self._plan(tensor, at, pairs), path)
        if isinstance(obj, dict):
            return {k: self._plan(v, (*path, k), pairs) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            if all(type(v) in _SCALARS for v in obj):  # Python's RNG state: 625 ints, no tensor
                return list(obj) if isinstance(obj, list) else obj
            copied = [self._plan(v, (*path, i), pairs) for i, v in enumerate(obj)]
            return copied if isinstance(obj, list) else tuple(copied)
        return obj

    def _buffer(self, tensor: torch.Tensor, path: tuple[Any, ...]) -> torch.Tensor:
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = self._pinned and tensor.is_cuda
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
            self._buffers[path] = buffer
        return buffer

    def synchronize(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()


_SCALARS = frozenset((int, float, bool, str, bytes, type(None)))


def _copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for source, buffer in pairs:
        buffer.copy_(source, non_blocking=source.is_cuda)


def _end_worker() -> None:
    """Not a save: the writer's thread ends (``CheckpointWriter.close``)."""


class CheckpointWriter:
    def __init__(self, storage: CheckpointStorage, keep: int = 2, asynchronous: bool = True):
        self.storage = storage
        self.keep = keep
        self.asynchronous = asynchronous
        self.known_bad: set[str] = set()
        self.pinned: set[str] = set()  # never deleted by retention (early stopping's best)
        self._results: queue.SimpleQueue[SaveResult] = queue.SimpleQueue()
        self._buffers = SnapshotBuffers()
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = threading.Event()  # no save in flight
        self._idle.set()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()

    def save(self, step: int, payload: dict[str, Any], meta: dict[str, Any],
             synchronous: bool = False, prepared_s: float = 0.0,
             before_commit: Callable[[], None] | None = None,
             shards: str | None = None,
             tensors: dict[str, torch.Tensor] | None = None) -> SaveResult | None:
        """Snapshot now; write now (sync, returns the result) or in the background (None).

        ``prepared_s``: what building ``payload`` already cost the training thread (part of
        the save's stall). ``before_commit``: waited for before the manifest is written (the
        shards every rank writes in the background: a checkpoint is complete with them).
        ``shards``: the checkpoint's shards folder, whose files the manifest lists;
        ``tensors``: the whole state this writer writes into it (``sharded.write_shards``)."""
        started = time.perf_counter() - prepared_s
        self.wait()  # at most one save in flight (and the buffers are free again)
        if synchronous or not self.asynchronous:  # the loop waits anyway: serialise live tensors
            return self._write(step, payload, meta, 0.0, synchronous=True, prepared_s=prepared_s,
                               before_commit=before_commit, shards=shards, tensors=tensors)
        snapshot, tensors = self._buffers.copy((payload, tensors))
        self._buffers.synchronize()
        stall_s = time.perf_counter() - started
        self._submit(lambda: self._results.put(
            self._write(step, snapshot, meta, stall_s, before_commit=before_commit,
                        shards=shards, tensors=tensors)))
        return None

    def _submit(self, job: Callable[[], None]) -> None:
        """Hand ``job`` to the writer's thread, started only when none is waiting for work:
        ``Thread.start`` blocks its caller until the new thread runs, and that thread, busy
        with the write, holds the GIL for milliseconds (2-3 ms of each save's stall)."""
        self._idle.clear()
        with self._worker_lock:
            self._jobs.put(job)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True,
                                                name="prudent-checkpoint-writer")
                self._worker.start()

    def _work(self) -> None:
        """The writer's thread: one save at a time; ends after a while without any."""
        while True:
            try:
                job = self._jobs.get(timeout=_WORKER_IDLE_S)
            except queue.Empty:
                with self._worker_lock:
                    if self._jobs.empty():
                        self._worker = None
                        return
                continue
            if job is _end_worker:
                return
            try:
                job()
            except Exception:  # noqa: BLE001 - told as a thread's own error is; the thread goes on
                threading.excepthook(threading.ExceptHookArgs(
                    (*sys.exc_info(), threading.current_thread())))
            finally:
                self._idle.set()

    def wait(self) -> None:
        """Block until the save in flight (if any) is durable or failed."""
        self._idle.wait()

    def close(self) -> None:
        """Wait for the save in flight, then end the writer's thread (the run has ended)."""
        self.wait()
        with self._worker_lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                self._jobs.put(_end_worker)
        if worker is not None:
            worker.join()

    def completed(self) -> list[SaveResult]:
        """Results of background saves finished since the last call (training thread)."""
        done: list[SaveResult] = []
        if self._results.empty():  # the common case, without raising queue.Empty each step
            return done
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                return done

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def _write(self, step: int, snapshot: dict[str, Any], meta: dict[str, Any],
               stall_s: float, synchronous: bool = False, prepared_s: float = 0.0,
               before_commit: Callable[[], None] | None = None,
               shards: str | None = None,
               tensors: dict[str, torch.Tensor] | None = None) -> SaveResult:
        name = checkpoint_name(step)
        result = SaveResult(name=name, step=step, stall_s=stall_s)
        started = time.perf_counter()
        handle = None
        try:
            result.not_finite = first_non_finite(snapshot) or first_non_finite(_by_object(tensors))
            if result.not_finite is not None:
                result.error = f"{result.not_finite} holds NaN or infinite values"
                result.write_s = time.perf_counter() - started
                return result
            snapshot = resolve(snapshot)  # a framework's files serialised here, off the loop
            if tensors and shards is not None:
                write_shards(self.storage, shards, tensors)
            handle = self.storage.begin(name)
            digest, state_bytes = self._write_state(handle, snapshot)
            result.num_bytes = state_bytes
            if before_commit is not None:
                before_commit()
            if shards is not None:  # durable on every rank now: listed, with their hashes
                files = shard_digests(self.storage, shards)
                meta = {**meta, "shards": {"folder": shards, "files": files,
                                           "by": "one" if tensors else "every rank"}}
                result.num_bytes += sum(entry["bytes"] for entry in files.values())
            self._write_manifest(handle, step, digest, state_bytes, meta)
            result.path = self.storage.commit(handle)
            handle = None
            self._check_committed(name, state_bytes)
            result.deleted = self._retain(newest=name)
        except _write_errors() as exc:  # reported as an event by the manager, never swallowed
            result.error = _describe(exc)
            if handle is not None:
                self._abort(handle)
        result.write_s = time.perf_counter() - started
        if synchronous:
            result.stall_s = prepared_s + result.write_s
        return result

    def _abort(self, handle: Any) -> None:
        """Clean up a failed save; what cannot be cleaned now (the storage it failed on) is
        never loaded (no manifest) and goes with the next save of that step or retention."""
        try:
            self.storage.abort(handle)
        except Exception:  # noqa: BLE001 - the save's own error is the one reported
            pass

    def _check_committed(self, name: str, num_bytes: int) -> None:
        """The committed checkpoint is all there (the full checksum is checked on load)."""
        if self.storage.read(name, MANIFEST_FILE) is None:
            raise OSError(f"{name} has no manifest after commit")
        size = self.storage.size(name, STATE_FILE)
        if size != num_bytes:
            raise OSError(f"{name}/{STATE_FILE} has {size} bytes after commit, expected {num_bytes}")

    def _write_state(self, handle: Any, snapshot: dict[str, Any]) -> tuple[str, int]:
        stream = self.storage.open_write(handle, STATE_FILE)
        hashing = _HashingWriter(stream)
        try:
            torch.save(snapshot, hashing)
        except Exception:
            if hashing.error is not None:  # torch reports a failed write as "unexpected pos"
                raise hashing.error from None
            raise
        finally:
            stream.close()
        return hashing.hexdigest(), hashing.num_bytes

    def _write_manifest(self, handle: Any, step: int, digest: str, num_bytes: int,
                        meta: dict[str, Any]) -> None:
        manifest = {"format": FORMAT_VERSION, "step": step, "created": time.time(), **meta,
                    "files": {STATE_FILE: {"sha256": digest, "bytes": num_bytes}}}
        stream = self.storage.open_write(handle, MANIFEST_FILE)
        try:
            stream.write(json.dumps(manifest, indent=1).encode())
        finally:
            stream.close()

    def _retain(self, newest: str) -> list[str]:
        """Keep ``newest`` (just verified) and the next ``keep - 1`` complete older ones."""
        newest_step = step_of(newest) or 0
        kept, deleted = {newest}, []
        for name in self.storage.checkpoints():  # newest first
            if name in kept:
                continue
            if (step_of(name) or 0) > newest_step and name not in self.known_bad:
                continue  # newer than ours (another attempt's): not ours to judge
            if name in self.pinned:
                continue  # kept whatever keep says (early stopping's best evaluation)
            complete = self.storage.read(name, MANIFEST_FILE) is not None
            if len(kept) < self.keep and complete and name not in self.known_bad:
                kept.add(name)
                continue
            self.storage.delete(name)
            self.storage.delete(name + SHARDS_SUFFIX)  # its shards, if it had any
            deleted.append(name)
        for folder in self.storage.names():  # shards of a save that never committed
            base = folder[:-len(SHARDS_SUFFIX)]
            if folder.endswith(SHARDS_SUFFIX) and (step_of(base) or newest_step) < newest_step \
                    and self.storage.read(base, MANIFEST_FILE) is None:
                self.storage.delete(folder)
        if isinstance(self.storage, LocalStorage):
            self.storage.remove_stale_staging()
        return deleted


def load_latest(storage: CheckpointStorage) -> LoadedCheckpoint | None:
    """The newest checkpoint that passes its checks, with the reasons newer ones were skipped."""
    skipped: list[tuple[str, str]] = []
    for name in storage.checkpoints():
        problem, data, shards = _check(storage, name)
        if problem is None:
            try:
                payload = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
                return LoadedCheckpoint(name, payload, skipped, *shards)
            except Exception as exc:  # noqa: BLE001 - any deserialiser error means unusable
                problem = f"cannot be deserialised safely ({type(exc).__name__}: {exc})"
        skipped.append((name, problem))
    return None if not skipped else LoadedCheckpoint("", {}, skipped)


def load_checkpoint(storage: CheckpointStorage, name: str) -> LoadedCheckpoint | None:
    """One checkpoint if it passes its checks (None otherwise)."""
    problem, data, shards = _check(storage, name)
    if problem is not None:
        return None
    try:
        payload = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - any deserialiser error means unusable
        return None
    return LoadedCheckpoint(name, payload, [], *shards)


def _check(storage: CheckpointStorage,
           name: str) -> tuple[str | None, bytes, tuple[dict[str, dict[str, Any]], bool]]:
    """(None, state bytes, (shard files, whether their hashes were checked)) if the
    checkpoint's files match its manifest, else (why not, b"", ({}, False)). Shards one
    process wrote (replicated state) are hashed here, like ``state.pt``: a corrupted one is
    skipped for the one before. Shards every rank wrote are only listed here (present, full
    size): each rank hashes its share before loading them (``checkpoint.sharded``)."""
    nothing: tuple[dict[str, dict[str, Any]], bool] = ({}, False)
    raw = storage.read(name, MANIFEST_FILE)
    if raw is None:
        return "has no manifest (the save never finished)", b"", nothing
    try:
        manifest = json.loads(raw)
        expected = manifest["files"][STATE_FILE]
        shards = manifest.get("shards")
        shard_files = dict(shards["files"]) if shards else {}
    except (ValueError, KeyError, TypeError):
        return "has an unreadable manifest", b"", nothing
    data = storage.read(name, STATE_FILE)
    if data is None:
        return f"is missing {STATE_FILE}", b"", nothing
    if len(data) != expected["bytes"]:
        return f"is truncated ({len(data)} of {expected['bytes']} bytes)", b"", nothing
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        return "is corrupted (checksum mismatch)", b"", nothing
    if not shards:
        return None, data, nothing
    problem = missing_shards(storage, shards["folder"], shard_files)
    if problem is not None:
        return problem, b"", nothing
    if shards.get("by") != "one":
        return None, data, (shard_files, False)
    bad = corrupted_shards(storage, shards["folder"], shard_files, 0, 1)
    if bad:
        return f"is corrupted (checksum mismatch of {', '.join(bad)})", b"", nothing
    return None, data, (shard_files, True)


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a failed save raises: any ``Exception``, and DCP's ``CheckpointException``, a
    ``BaseException`` (uncaught, it would end the writer thread with a traceback and the save's
    result would never reach the manager)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return Exception, CheckpointException


def _describe(exc: BaseException) -> str:
    """One line: DCP's exception names the error each rank met, not its tracebacks."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    return f"{type(exc).__name__}: {exc}"


def _by_object(tensors: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    """DCP's ``<key>/<name>`` tensors as ``objects.<key>.<name>`` (a finding names them so)."""
    found: dict[str, Any] = {}
    for flat, tensor in (tensors or {}).items():
        key, _, name = flat.partition("/")
        found.setdefault(key, {})[name] = tensor
    return {"objects": found} if found else {}


class _HashingWriter:
    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.num_bytes = 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._hash.update(view)
        self.num_bytes += view.nbytes
        try:
            self._stream.write(view)
        except OSError as exc:
            self.error = exc
            raise
        return view.nbytes

    def flush(self) -> None:
        self._stream.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
