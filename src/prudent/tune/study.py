"""Where a study lives, and opening it: a journal file on one machine, a database across machines.

The default storage is Optuna's journal file ``<home>/studies/<name>.journal``: several worker
processes append to it safely (SQLite under parallel writers gives "database is locked").
Several machines share one study through ``--storage postgresql://...`` (any SQLAlchemy URL
Optuna's ``RDBStorage`` accepts). ``optuna-dashboard`` reads either as is.

What a study is about (objective, direction, space, pruner) is kept in the study's user
attributes, so a restarted ``prudent tune``, ``prudent study`` and the trial processes all read
the same definition, and a restart with a different definition is refused, not mixed in.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prudent.kernel.errors import ConfigError

if TYPE_CHECKING:
    import optuna

__all__ = ["META_KEY", "create_or_load", "import_optuna", "load", "meta_of", "open_storage",
           "storage_url", "study_dir", "study_lock", "validate_study_name"]

META_KEY = "prudent"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_COMPARED = ("objective", "direction", "space")


def validate_study_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ConfigError(f"study name {name!r} is invalid: use 1-64 letters, digits, '.', '_' "
                          "or '-', starting with a letter or digit (it names a file)")
    return name


def study_dir(home: str | Path, name: str) -> Path:
    """``<home>/studies/<name>``: the study's plots and lock."""
    path = Path(home).resolve() / "studies" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def storage_url(home: str | Path, name: str, url: str | None = None) -> str:
    """The storage a study uses: ``url`` if given, else its journal file under ``home``."""
    if url:
        return url
    return str(Path(home).resolve() / "studies" / f"{name}.journal")


def open_storage(url: str, heartbeat_s: int | None = None) -> optuna.storages.BaseStorage:
    """A journal file (a path, or ``journal:///path``) or a database URL, opened in one place.

    ``heartbeat_s`` (a database only): the workers' storage, with Optuna's heartbeat every
    that many seconds and the retry of a trial whose machine went silent
    (:mod:`prudent.tune.machines`).
    """
    optuna = import_optuna()
    if "://" not in url or url.startswith("journal://"):
        path = Path(url.removeprefix("journal://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    from prudent.tune.machines import open_rdb

    try:
        return open_rdb(url, heartbeat_s)
    except (ImportError, ModuleNotFoundError) as exc:
        raise ConfigError(f"--storage {url!r}: its database driver is missing ({exc}); "
                          "install it, e.g. pip install psycopg2-binary") from None


def create_or_load(name: str, storage: optuna.storages.BaseStorage, meta: Mapping[str, Any],
                   sampler: Any = None, pruner: Any = None) -> optuna.Study:
    """Open the study, creating it with ``meta`` if new; refuse a restart that changes it."""
    optuna = import_optuna()
    direction = "maximize" if meta["direction"] == "max" else "minimize"
    study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                sampler=sampler, pruner=pruner, load_if_exists=True)
    saved = study.user_attrs.get(META_KEY)
    if saved is None:
        study.set_user_attr(META_KEY, {**meta, "token": secrets.token_hex(3)})
        return study
    for key in _COMPARED:
        if saved.get(key) != meta.get(key):
            raise ConfigError(
                f"study {name!r} exists with a different {key} ({_short(saved.get(key))} there, "
                f"{_short(meta.get(key))} now): a study must keep one definition. Continue it "
                "with the same flags, or start a new one with --study NEW_NAME")
    updated = {**saved, **{k: v for k, v in meta.items() if k not in _COMPARED}}
    if updated != saved:
        study.set_user_attr(META_KEY, updated)
    return study


def load(name: str, storage: optuna.storages.BaseStorage, sampler: Any = None,
         pruner: Any = None) -> optuna.Study:
    """An existing study; a clear error when there is none."""
    optuna = import_optuna()
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        known = optuna.get_all_study_names(storage)
        raise ConfigError(f"no study {name!r} in this storage (studies: "
                          f"{', '.join(known) or 'none'}); start one with prudent tune "
                          f"--study {name} --space ... -- python train.py") from None


def meta_of(study: optuna.Study) -> dict[str, Any]:
    return dict(study.user_attrs.get(META_KEY) or {})


@contextmanager
def study_lock(home: str | Path, name: str) -> Iterator[None]:
    """One machine's workers take turns to pick the next trial (count, budget, ask)."""
    import fcntl

    path = study_dir(home, name) / "lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("prudent tune needs Optuna: pip install 'prudent[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna
