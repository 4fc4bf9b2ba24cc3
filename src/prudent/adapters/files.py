"""The framework's own checkpoint, carried inside prudent's checkpoint.

prudent's Checkpointer decides when a checkpoint is taken (its schedule, and at once when a
stop is requested), writes it atomically with a checksum, keeps the newest N and ships it to
object storage. An adapter attaches a :class:`FrameworkCheckpoint` to the run: when the
Checkpointer saves, it asks the framework to write its own checkpoint (Lightning's
``trainer.save_checkpoint``, a Hugging Face checkpoint folder, Keras weights and optimizer)
into a scratch folder and hands the bytes over; when the run resumes, the bytes come back as
files the framework reads (``ckpt_path``, ``resume_from_checkpoint``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prudent.checkpoint.deferred import DeferredFile, resolve

__all__ = ["FrameworkCheckpoint", "folder_files", "torch_bytes"]

# writes into a folder, returns the file or folder to resume from (None: nothing new to carry)
Writer = Callable[[Path], "Path | None"]
# or, without the disk: {name: bytes} of the files, the first one is resumed from (None: as above);
# or (entry, {name: bytes}) to resume from a folder the files are in; a file's bytes may come
# as a DeferredFile (the object to torch.save: serialised by the checkpoint writer's thread)
MemoryWriter = Callable[
    [], "dict[str, bytes | DeferredFile] | tuple[str, dict[str, bytes | DeferredFile]] | None"]
# loads the restored entry into the live framework's objects (a rollback while it trains)
Loader = Callable[[Path], None]


class FrameworkCheckpoint:
    """One framework's checkpoint as an attachable object (``state_dict``/``load_state_dict``).

    ``folder`` is where it writes (``<run folder>/<framework>``). Until :meth:`bind` gives it
    the framework's writer (the framework is not set up yet, or has gone), a save carries the
    files it was restored from, so a stop before training starts loses nothing.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.restored: Path | None = None  # what the framework resumes from, once restored
        self._write: Writer | None = None
        self._in_memory: MemoryWriter | None = None
        self._load_live: Loader | None = None
        self._state: dict[str, Any] = {}

    def bind(self, write: Writer | None, in_memory: MemoryWriter | None = None,
             load_live: Loader | None = None) -> None:
        """``in_memory``, when given, is tried first: the training thread then neither writes
        nor reads back a file nor makes a folder (``write`` is the fallback: it returned
        None). ``load_live``: while bound, a checkpoint restored during training (a rollback,
        early stopping's best weights) is loaded into the framework's live objects too, not
        only kept for the next resume."""
        self._write, self._in_memory, self._load_live = write, in_memory, load_live

    @property
    def loads_live(self) -> bool:
        return self._load_live is not None

    def state_dict(self) -> dict[str, Any]:
        """The framework's files as uint8 tensors, serialised now."""
        return resolve(self.deferred_state_dict())

    def deferred_state_dict(self) -> dict[str, Any]:
        """As :meth:`state_dict`, but a file the in-memory writer hands over as the object to
        ``torch.save`` stays a :class:`~prudent.checkpoint.deferred.DeferredFile`: the
        checkpoint writer copies its tensors with the snapshot and serialises it on its own
        thread (the Checkpointer's save asks for this one)."""
        if self._write is None:
            return dict(self._state)
        files = self._in_memory() if self._in_memory is not None else None
        if isinstance(files, tuple):
            return {"entry": files[0], "files": _as_tensors(files[1])}
        if files:
            return {"entry": next(iter(files)), "files": _as_tensors(files)}
        scratch = self.folder / "saving"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        try:
            entry = self._write(scratch)
            if entry is None:
                return dict(self._state)
            files = folder_files(scratch)
            return {"entry": entry.relative_to(scratch).as_posix(), "files": _as_tensors(files)}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = dict(state)  # carried on until the framework writes a newer one
        if not state.get("files"):
            return
        target = self.folder / "restored"
        shutil.rmtree(target, ignore_errors=True)
        for name, data in state["files"].items():
            path = (target / name).resolve()
            if target.resolve() not in path.parents:  # written by us, but never trust a path
                raise ValueError(f"checkpoint file {name!r} points outside {target}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data if isinstance(data, bytes) else data.numpy().tobytes())
        self.restored = target / state["entry"]
        if self._load_live is not None:
            self._load_live(self.restored)


def folder_files(folder: Path, prefix: str = "") -> dict[str, bytes]:
    """Every file under ``folder`` as ``{prefix + relative path: bytes}``, in path order."""
    return {prefix + p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def torch_bytes(obj: Any) -> bytes:
    """``torch.save(obj)`` into memory: a framework's file made without the disk."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _as_tensors(files: dict[str, Any]) -> dict[str, Any]:
    """The files as uint8 tensors: ``torch.save`` stores a tensor's bytes as they are, where it
    pickles ``bytes`` (protocol 2, the one ``weights_only`` loading reads) as a latin-1 string,
    1.5x their size for compressed or binary data. Checkpoints holding ``bytes`` still load.
    A DeferredFile stays one (its bytes are made later)."""
    import torch

    return {name: data if isinstance(data, DeferredFile)
            else torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
            else torch.empty(0, dtype=torch.uint8) for name, data in files.items()}
