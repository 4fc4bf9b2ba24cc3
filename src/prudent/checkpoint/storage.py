"""Where checkpoints live: a local folder, or any fsspec URL (``s3://bucket/prefix``).

A checkpoint is a folder ``ckpt-<step>`` holding ``state.pt`` and ``manifest.json``, and
beside it ``ckpt-<step>.shards``, the models' DCP shards (``sharded.py``); the manifest is
written last and carries a checksum per file, so a checkpoint without a valid manifest is
incomplete, whatever else is there. Locally the folder is staged under a temporary
name, fsynced and renamed (atomic); object stores have no rename, so there the manifest is the
commit marker.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, Any

from prudent.kernel.errors import ConfigError
from prudent.launch.spec import ENV_S3_ENDPOINT_URL

__all__ = ["CheckpointStorage", "FsspecStorage", "LocalStorage", "default_location",
           "open_storage"]

SAGEMAKER_CHECKPOINTS = "/opt/ml/checkpoints"
_NAME = re.compile(r"^ckpt-(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:010d}"


def step_of(name: str) -> int | None:
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


_WRITABLE: set[str] = set()  # locations this process has written a probe to


class CheckpointStorage(ABC):
    """Stage files of one checkpoint, commit them, list, read and delete checkpoints.

    Contract: ``begin(name)`` returns a staging handle; ``open_write(handle, file)`` files are
    complete once closed; ``commit(handle)`` makes the checkpoint visible under ``name``
    atomically where the backend can. Only the writer thread calls these, one save at a time.
    """

    url: str

    @abstractmethod
    def begin(self, name: str) -> Any: ...

    @abstractmethod
    def open_write(self, handle: Any, filename: str) -> IO[bytes]: ...

    @abstractmethod
    def commit(self, handle: Any) -> str: ...

    @abstractmethod
    def abort(self, handle: Any) -> None: ...

    @abstractmethod
    def names(self) -> list[str]: ...

    @abstractmethod
    def read(self, name: str, filename: str) -> bytes | None: ...

    @abstractmethod
    def delete(self, name: str) -> None: ...

    @abstractmethod
    def size(self, name: str, filename: str) -> int | None: ...

    @abstractmethod
    def put(self, name: str, filename: str, data: bytes) -> None:
        """Write one small file of folder ``name`` whole, atomically: a reader sees the old
        file (or none) or the new one, never part of it (the run's record, its heartbeat)."""

    @abstractmethod
    def files(self, name: str) -> list[str]:
        """The file names in folder ``name`` (none when it does not exist)."""

    @abstractmethod
    def delete_file(self, name: str, filename: str) -> None:
        """Remove one file of folder ``name`` (nothing when it is not there)."""

    def read_many(self, name: str, filenames: list[str]) -> dict[str, bytes | None]:
        """Several files of folder ``name`` (None for one that cannot be read)."""
        return {filename: self.read(name, filename) for filename in filenames}

    @abstractmethod
    def open_read(self, name: str, filename: str) -> IO[bytes]:
        """A stream of one file of folder ``name`` (large files, read in pieces)."""

    def file_sizes(self, name: str) -> dict[str, int]:
        """Each file of folder ``name`` and its size in bytes (one listing where it can)."""
        sizes = {filename: self.size(name, filename) for filename in self.files(name)}
        return {filename: size for filename, size in sizes.items() if size is not None}

    @abstractmethod
    def dcp_writer(self, name: str) -> Any:
        """A ``torch.distributed.checkpoint`` storage writer into folder ``name``."""

    @abstractmethod
    def dcp_reader(self, name: str) -> Any:
        """A ``torch.distributed.checkpoint`` storage reader of folder ``name``."""

    def check_writable(self) -> None:
        """Write one empty file and delete it: a location no checkpoint can be written to (a
        bucket that does not exist, no permission) is a :class:`ConfigError` naming it and
        the fix, before any training, instead of failing every save of a run that then cannot
        survive its machine."""
        if self.url in _WRITABLE:
            return  # the record's import and the checkpointer open the same location
        probe = f".prudent-probe-{uuid.uuid4().hex[:12]}"
        try:
            self.put(probe, "probe", b"")
            self.delete(probe)
        except Exception as exc:  # noqa: BLE001 - any backend's refusal, named
            raise ConfigError(
                f"cannot write checkpoints to {self.url!r}: {type(exc).__name__}: {exc}. Nothing "
                "was trained: fix checkpoint.url (PRUDENT_CHECKPOINT_URL) or the location "
                "(create the bucket or folder, grant write access), then run again") from None
        _WRITABLE.add(self.url)

    def checkpoints(self) -> list[str]:
        """Checkpoint names, newest (highest step) first."""
        found = [n for n in self.names() if step_of(n) is not None]
        return sorted(found, key=lambda n: step_of(n) or 0, reverse=True)


class LocalStorage(CheckpointStorage):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path)
        self.url = str(self.root)

    def begin(self, name: str) -> tuple[str, Path]:
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        return name, staging

    def open_write(self, handle: tuple[str, Path], filename: str) -> IO[bytes]:
        return _SyncedFile(handle[1] / filename)

    def commit(self, handle: tuple[str, Path]) -> str:
        name, staging = handle
        _fsync_dir(staging)
        final = self.root / name
        if final.exists():  # the same step saved again after a resume: replace it
            old = self.root / f".old-{name}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            staging.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(final)
        _fsync_dir(self.root)
        return str(final)

    def abort(self, handle: tuple[str, Path]) -> None:
        shutil.rmtree(handle[1], ignore_errors=True)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.name for p in self.root.iterdir() if p.is_dir()]

    def read(self, name: str, filename: str) -> bytes | None:
        try:
            return (self.root / name / filename).read_bytes()
        except OSError:
            return None

    def delete(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)

    def size(self, name: str, filename: str) -> int | None:
        try:
            return (self.root / name / filename).stat().st_size
        except OSError:
            return None

    def put(self, name: str, filename: str, data: bytes) -> None:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / f".tmp-{filename}-{uuid.uuid4().hex[:8]}"
        with _SyncedFile(staging) as stream:
            stream.write(data)
        staging.replace(folder / filename)
        _fsync_dir(folder)

    def delete_file(self, name: str, filename: str) -> None:
        (self.root / name / filename).unlink(missing_ok=True)

    def files(self, name: str) -> list[str]:
        folder = self.root / name
        if not folder.is_dir():
            return []
        return [p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".tmp-")]

    def open_read(self, name: str, filename: str) -> IO[bytes]:
        return open(self.root / name / filename, "rb")  # noqa: SIM115 - the caller closes it

    def dcp_writer(self, name: str) -> Any:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(self.root / name)

    def dcp_reader(self, name: str) -> Any:
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(self.root / name)

    def remove_stale_staging(self) -> int:
        """Staging folders left by a process killed mid-save."""
        stale = [*self.root.glob(".tmp-ckpt-*"), *self.root.glob(".old-ckpt-*")]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return len(stale)


class FsspecStorage(CheckpointStorage):
    def __init__(self, url: str, **options: Any) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.options = options  # DCP's fsspec writer and reader open the location alike
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **options)

    def begin(self, name: str) -> str:
        self.delete(name)  # a half-uploaded checkpoint of the same name (a crash mid-upload)
        return name

    def open_write(self, handle: str, filename: str) -> IO[bytes]:
        return self.fs.open(f"{self.root}/{handle}/{filename}", "wb")  # type: ignore[no-any-return]

    def commit(self, handle: str) -> str:
        return f"{self.url}/{handle}"

    def abort(self, handle: str) -> None:
        self.delete(handle)

    def names(self) -> list[str]:
        try:
            entries = self.fs.ls(self.root, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def read(self, name: str, filename: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self.root}/{name}/{filename}")  # type: ignore[no-any-return]
        except (FileNotFoundError, OSError):
            return None

    def delete(self, name: str) -> None:
        try:
            self.fs.rm(f"{self.root}/{name}", recursive=True)
        except FileNotFoundError:
            pass

    def read_many(self, name: str, filenames: list[str]) -> dict[str, bytes | None]:
        """Fetched concurrently (one request each, not one after another)."""
        paths = {f"{self.root}/{name}/{filename}": filename for filename in filenames}
        if not paths:
            return {}
        found = self.fs.cat(list(paths), on_error="return")
        return {paths[path]: data if isinstance(data, bytes) else None
                for path, data in found.items() if path in paths}

    def put(self, name: str, filename: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.root}/{name}/{filename}", data)  # one PUT: whole or nothing

    def delete_file(self, name: str, filename: str) -> None:
        try:
            self.fs.rm_file(f"{self.root}/{name}/{filename}")
        except FileNotFoundError:
            pass

    def files(self, name: str) -> list[str]:
        try:
            entries = self.fs.ls(f"{self.root}/{name}", detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return [str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries
                if e.get("type") != "directory"]

    def size(self, name: str, filename: str) -> int | None:
        try:
            return int(self.fs.size(f"{self.root}/{name}/{filename}"))
        except (FileNotFoundError, OSError):
            return None

    def open_read(self, name: str, filename: str) -> IO[bytes]:
        return self.fs.open(f"{self.root}/{name}/{filename}", "rb")  # type: ignore[no-any-return]

    def file_sizes(self, name: str) -> dict[str, int]:
        try:
            entries = self.fs.ls(f"{self.root}/{name}", detail=True, refresh=True)
        except FileNotFoundError:
            return {}
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e["size"]) for e in entries
                if e.get("type") != "directory"}

    def dcp_writer(self, name: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(f"{self.url}/{name}", **self.options)

    def dcp_reader(self, name: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(f"{self.url}/{name}", **self.options)


def default_location(run_id: str, run_dir: Path) -> str:
    """Where a run's checkpoints go when ``checkpoint.url`` is not set."""
    if os.environ.get("SM_TRAINING_ENV") and os.path.isdir(SAGEMAKER_CHECKPOINTS):
        return f"{SAGEMAKER_CHECKPOINTS}/{run_id}"
    return str(run_dir / "checkpoints")


def open_storage(url: str) -> CheckpointStorage:
    """A local path or ``file://`` URL -> LocalStorage; any other fsspec protocol -> FsspecStorage."""
    if "://" not in url or url.startswith("file://"):
        return LocalStorage(url.removeprefix("file://"))
    protocol = url.split("://", 1)[0]
    try:
        import fsspec

        fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        hint = ("pip install 'prudent[s3]'" if protocol in ("s3", "s3a")
                else f"install the fsspec backend for {protocol}")
        raise ConfigError(f"checkpoint url {url!r} needs a package that is missing ({exc}): {hint}") from None
    except ValueError:
        raise ConfigError(f"checkpoint url {url!r} has an unknown scheme {protocol!r}: use a "
                          "local folder or an fsspec URL such as s3://bucket/prefix") from None
    endpoint = os.environ.get(ENV_S3_ENDPOINT_URL) or os.environ.get("AWS_ENDPOINT_URL")
    options = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint and protocol.startswith("s3") else {}
    return FsspecStorage(url, **options)


class _SyncedFile:
    """A file that is fsynced when closed: 'written' must mean 'on disk'."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()

    def write(self, data: Any) -> int:
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> _SyncedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
