"""A capture bundle on disk: written atomically, bounded in size, checked before it is trusted.

A bundle is a folder ``captures/step-<N>``::

    batch.pt            the batch the failing step trained on (tensors, as the loader gave it)
    run.pt              the run's counters, the RNG states when the batch arrived, the loss
    object-<key>.pt     each attached object's state_dict (model, optimizer, ...), before the update
    info.json           why, where (step, epoch, sample indices), stack, config, versions, git
    manifest.json       written last: size and sha256 of every file above

It is staged under a temporary name and renamed (the checkpoint storage's ``LocalStorage``), so
a bundle either is complete or has no manifest. Every ``.pt`` file is loaded with
``torch.load(weights_only=True)``: opening a bundle someone sent you runs none of their code.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prudent.checkpoint.storage import LocalStorage
from prudent.kernel.errors import ConfigError

__all__ = ["BATCH_FILE", "RUN_FILE", "Bundle", "BundleWritten", "format_size", "object_file",
           "read_bundle", "write_bundle"]

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
INFO_FILE = "info.json"
BATCH_FILE = "batch.pt"
RUN_FILE = "run.pt"
_REPLAY_HINT = ("capture it again, or replay from a checkpoint: prudent replay RUN --step S -- "
                "python train.py")


def object_file(key: str) -> str:
    return f"object-{key}.pt"


@dataclass
class BundleWritten:
    path: str
    num_bytes: int
    left_out: list[dict[str, Any]] = field(default_factory=list)


def write_bundle(folder: Path, name: str, info: dict[str, Any], batch: Any,
                 run_state: dict[str, Any], objects: dict[str, Any],
                 max_bytes: int) -> BundleWritten:
    """Write the bundle ``folder/name``; parts that would pass ``max_bytes`` are left out.

    Priority: the batch and the run state (small, and what a replay cannot do without), then
    the attached objects smallest first, so a huge optimizer state goes before the model.
    """
    parts: dict[str, bytes] = {}
    left_out: list[dict[str, Any]] = []
    budget = max_bytes - 64 * 1024  # room for info.json and the manifest
    candidates = [(BATCH_FILE, "batch", batch), (RUN_FILE, "run state", run_state)]
    candidates += sorted(((object_file(k), k, v) for k, v in objects.items()),
                         key=lambda item: _tensor_bytes(item[2]))
    for filename, what, payload in candidates:
        data = None if _tensor_bytes(payload) > budget else _serialise(payload)
        if data is None or len(data) > budget:
            size = _tensor_bytes(payload) if data is None else len(data)
            left_out.append({"part": what, "file": filename, "bytes": size,
                             "why": f"{format_size(size)} does not fit in the "
                                    f"{format_size(budget)} "
                                    f"left of max_bytes={format_size(max_bytes)}"})
            continue
        parts[filename] = data
        budget -= len(data)
    info = {**info, "left_out": left_out, "objects": sorted(objects)}
    parts[INFO_FILE] = json.dumps(info, indent=1, default=str).encode()
    return _commit(folder, name, parts, left_out)


def _commit(folder: Path, name: str, parts: dict[str, bytes],
            left_out: list[dict[str, Any]]) -> BundleWritten:
    storage = LocalStorage(folder)
    handle = storage.begin(name)
    try:
        for filename, data in parts.items():
            with storage.open_write(handle, filename) as stream:
                stream.write(data)
        manifest = {"format": FORMAT_VERSION, "created": time.time(),
                    "files": {f: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
                              for f, d in parts.items()}}
        raw = json.dumps(manifest, indent=1).encode()
        with storage.open_write(handle, MANIFEST_FILE) as stream:
            stream.write(raw)
        path = storage.commit(handle)
    except BaseException:
        storage.abort(handle)
        raise
    return BundleWritten(path, sum(map(len, parts.values())) + len(raw), left_out)


@dataclass
class Bundle:
    """A bundle whose files all matched their manifest when it was opened."""

    path: Path
    info: dict[str, Any]
    manifest: dict[str, Any]

    def has(self, filename: str) -> bool:
        return filename in self.manifest["files"]

    def load(self, filename: str) -> Any:
        """One ``.pt`` file, on the CPU, with ``weights_only=True`` (no code from the file runs)."""
        import torch

        data = _checked_bytes(self.path, filename, self.manifest["files"][filename])
        try:
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - any deserialiser error means unusable
            raise ConfigError(f"capture bundle {self.path}: {filename} cannot be loaded safely "
                              f"({type(exc).__name__}: {exc}); refusing to replay it: "
                              f"{_REPLAY_HINT}") from None

    @property
    def num_bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.manifest["files"].values())


def read_bundle(path: str | Path) -> Bundle:
    """Open a bundle, checking every file against its manifest (size and sha256).

    Raises :class:`ConfigError` naming what is wrong: no such folder, no manifest (not a
    bundle, or a write that never finished), a missing, truncated or corrupted file.
    """
    folder = Path(path)
    if not folder.exists():
        raise ConfigError(f"no capture bundle at {folder}: give the folder a failure capture "
                          "wrote (.prudent/runs/<run>/captures/step-<N>, named by the run's "
                          "events: prudent show RUN)")
    if not folder.is_dir():
        raise ConfigError(f"{folder} is a file, not a capture bundle folder (captures/step-<N>)")
    manifest = _read_manifest(folder)
    for filename, expected in manifest["files"].items():
        _checked_bytes(folder, filename, expected)
    try:
        info = json.loads((folder / INFO_FILE).read_bytes())
    except ValueError as exc:
        raise _refuse(folder, f"{INFO_FILE} is not valid JSON ({exc})") from None
    return Bundle(folder, info, manifest)


def _read_manifest(folder: Path) -> dict[str, Any]:
    try:
        raw = (folder / MANIFEST_FILE).read_bytes()
    except OSError:
        raise _refuse(folder, f"it has no {MANIFEST_FILE}: not a prudent capture bundle, or its "
                      "write never finished") from None
    try:
        manifest = json.loads(raw)
        files = manifest["files"]
        if not isinstance(files, dict) or INFO_FILE not in files:
            raise KeyError(INFO_FILE)
        if not all(_plain_name(f) and isinstance(e["sha256"], str) and int(e["bytes"]) >= 0
                   for f, e in files.items()):
            raise ValueError("bad file entry")
    except (ValueError, KeyError, TypeError):
        raise _refuse(folder, f"its {MANIFEST_FILE} is unreadable (truncated or edited)") from None
    if int(manifest.get("format", 0)) > FORMAT_VERSION:
        raise _refuse(folder, f"it was written in bundle format {manifest['format']} by a newer "
                      f"prudent (this one reads format {FORMAT_VERSION}): upgrade prudent")
    return manifest  # type: ignore[no-any-return]


def _checked_bytes(folder: Path, filename: str, expected: dict[str, Any]) -> bytes:
    try:
        data = (folder / filename).read_bytes()
    except OSError:
        raise _refuse(folder, f"{filename} is missing") from None
    if len(data) != int(expected["bytes"]):
        raise _refuse(folder, f"{filename} is truncated or altered ({len(data)} bytes, the "
                      f"manifest says {expected['bytes']})")
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise _refuse(folder, f"{filename} is corrupted (sha256 differs from the manifest)")
    return data


def _plain_name(filename: str) -> bool:
    return "/" not in filename and "\\" not in filename and filename not in ("", ".", "..")


def _refuse(folder: Path, why: str) -> ConfigError:
    return ConfigError(f"capture bundle {folder} is unusable: {why}; refusing to replay it: "
                       f"{_REPLAY_HINT}")


def _serialise(payload: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _tensor_bytes(obj: Any) -> int:
    """What the tensors inside ``obj`` weigh (an estimate of the file, before writing it)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def format_size(num_bytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if num_bytes < 1000:
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    return f"{num_bytes:.1f} TB"
