"""A damaged run store: say what is wrong with it, and repair it keeping every readable row.

The embedded store is one SQLite file. A disk that filled, a machine that died in a write, a
copy cut short can leave it corrupt ("database disk image is malformed"), truncated or empty,
and training never depends on it (``prudent.launch.supervisor``), so it is found out later, by a
command that reads it. ``prudent store check`` says what SQLite's own integrity check finds,
how many rows each table still yields, and which runs have a record beside their checkpoints
but no row in the store. ``prudent store repair`` copies every row SQLite can still read into
a fresh store (a table that fails to scan is read again in ever smaller ranges of row ids, so
only the rows on damaged pages are lost), keeps the damaged file beside it, and adds back from
each run's record (written at every checkpoint, ``prudent.record``) what the store lost: the
run itself, its events and its metrics. A server store (PostgreSQL) is the server's to check
and repair: both commands refuse it.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from prudent.kernel.errors import ConfigError

__all__ = ["StoreHealth", "check_store", "repair_store", "store_app"]

TABLES = ("runs", "metrics", "events")  # the rollup is summed again from the metrics
_MAX_FAILED_READS = 20000  # per table: past this, its damaged part is given up
_GENERATED_ID = re.compile(r"^(.*)-\d{8}-\d{6}-[0-9a-f]{4}$")


@dataclass
class StoreHealth:
    path: Path
    problems: list[str] = field(default_factory=list)
    rows: dict[str, int | None] = field(default_factory=dict)  # None: the table cannot be read
    records_only: list[str] = field(default_factory=list)  # runs a record holds, the store not
    missing: bool = False  # no store file yet: nothing has run with this home (not damage)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"store": str(self.path), "ok": self.ok, "exists": not self.missing,
                "problems": self.problems,
                "rows": self.rows, "runs_only_in_records": self.records_only}


@dataclass
class RepairResult:
    path: Path
    kept_aside: Path | None
    copied: dict[str, int]
    lost: dict[str, int]  # rows on damaged pages: (at least) this many could not be read
    from_records: dict[str, int]  # runs, events and metrics added back from the records

    def as_dict(self) -> dict[str, Any]:
        return {"store": str(self.path), "damaged_copy": str(self.kept_aside or ""),
                "copied": self.copied, "unreadable": self.lost,
                "from_records": self.from_records}


def check_store(path: Path, home: Path) -> StoreHealth:
    """What is wrong with the SQLite store at ``path`` (nothing is written)."""
    health = StoreHealth(path)
    if not path.is_file():
        health.missing = True
    elif path.stat().st_size == 0:
        health.problems.append(f"{path} is empty (0 bytes): the runs it held are gone from it")
    else:
        try:
            with _read_only(path) as conn:
                try:
                    found = [row[0] for row in conn.execute("PRAGMA integrity_check(20)")]
                except sqlite3.DatabaseError as exc:  # too damaged to be checked through
                    found = [str(exc)]
                if found != ["ok"]:
                    health.problems += [f"corrupt: {line}" for line in found]
                for table in TABLES:
                    health.rows[table] = _count(conn, table)
        except sqlite3.DatabaseError as exc:
            health.problems.append(f"{path} cannot be read as a database ({exc})")
    known = set(_run_ids(path)) if health.rows.get("runs") is not None else set()
    health.records_only = [run for run in _runs_with_records(home) if run not in known]
    if health.records_only and health.ok:
        health.problems.append(f"{len(health.records_only)} run(s) have a record beside their "
                               "checkpoints but no row in the store"
                               + (" (the store file is gone)" if health.missing else ""))
    return health


def repair_store(path: Path, home: Path) -> RepairResult:
    """Copy every readable row into a fresh store at ``path``, keep the damaged file beside it
    (``<path>.damaged-<time>``), and add back from the runs' records what the store lacks."""
    from prudent.store.database import Store

    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(path.name + ".repairing")
    for leftover in (fresh, *_sidecars(fresh)):
        leftover.unlink(missing_ok=True)
    copied: dict[str, int] = {}
    lost: dict[str, int] = {}
    Store(f"sqlite:///{fresh}").close()  # today's schema, empty
    if path.is_file() and path.stat().st_size:
        target = sqlite3.connect(fresh)
        try:
            with _read_only(path) as source:
                for table in TABLES:
                    copied[table], lost[table] = _copy_table(source, target, table)
            target.commit()
        finally:
            target.close()  # the last connection: its WAL is folded in before the rename
    kept_aside = None
    if path.is_file():
        kept_aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(kept_aside)
        for sidecar in _sidecars(path):  # its journal belongs to the damaged file
            if sidecar.exists():
                sidecar.rename(kept_aside.with_name(kept_aside.name + sidecar.name[len(path.name):]))
    fresh.rename(path)
    store = Store(f"sqlite:///{path}")
    try:
        store.rebuild_rollup()
        added = _from_records(store, home)
    finally:
        store.close()
    return RepairResult(path, kept_aside, copied, lost, added)


def _copy_table(source: sqlite3.Connection, target: sqlite3.Connection,
                table: str) -> tuple[int, int]:
    """(rows copied, rows known unreadable) of ``table``; the rows keep their ids."""
    columns = [row[1] for row in _quiet(lambda: list(source.execute(
        f"PRAGMA table_info({table})")), [])]
    wanted = [c[1] for c in target.execute(f"PRAGMA table_info({table})")]
    shared = [c for c in wanted if c in columns]
    if not shared:
        return 0, 0
    select = f"SELECT {', '.join(shared)} FROM {table}"
    insert = (f"INSERT OR IGNORE INTO {table} ({', '.join(shared)}) "
              f"VALUES ({', '.join('?' for _ in shared)})")
    try:
        rows = source.execute(select).fetchall()
        target.executemany(insert, rows)
        return len(rows), 0
    except sqlite3.DatabaseError:
        pass
    copied = failed = 0
    top = _quiet(lambda: source.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0], None)
    ranges = [(1, int(top) if top is not None else 2**40)]
    while ranges and failed < _MAX_FAILED_READS:
        low, high = ranges.pop()
        try:
            rows = source.execute(f"{select} WHERE rowid BETWEEN ? AND ?", (low, high)).fetchall()
        except sqlite3.DatabaseError:
            failed += 1
            if high > low:
                middle = (low + high) // 2
                ranges += [(middle + 1, high), (low, middle)]
            continue
        target.executemany(insert, rows)
        copied += len(rows)
    expected = _quiet(lambda: source.execute(f"SELECT count(*) FROM {table}").fetchone()[0], None)
    return copied, max(0, int(expected) - copied) if expected is not None else 0


def _from_records(store: Any, home: Path) -> dict[str, int]:
    """Each run's record beside its checkpoints merged into the store: runs it lacks are made
    from their records (name, status and spend from the newest attempt)."""
    from prudent.checkpoint.storage import LocalStorage
    from prudent.record.importer import merge_into, read_record
    from prudent.store.database import run_folder

    added = {"runs": 0, "events": 0, "metrics": 0}
    for run_id in _runs_with_records(home):
        try:
            record = read_record(LocalStorage(run_folder(home, run_id) / "checkpoints"), run_id)
        except ConfigError as exc:
            print(f"prudent: warning: {exc}; that run's record is left out", flush=True)
            continue
        if record is None or not record.attempts:
            continue
        if store.get_run(run_id) is None:
            newest = max(record.attempts.values(), key=lambda a: a.last_seen)
            match = _GENERATED_ID.match(run_id)
            store.create_run(
                run_id, match.group(1) if match else run_id,
                status=newest.status or "failed", host=newest.host, pid=newest.pid,
                started_at=record.started_at() or newest.started_at, ended_at=newest.last_seen,
                stop_reason=newest.stop_reason or (None if newest.status else
                                                   "lost: its last attempt never ended cleanly"),
                step=newest.step)
            added["runs"] += 1
        result = merge_into(store, run_id, record, current="")
        added["events"] += result.num_events
        added["metrics"] += result.num_metrics
    return added


def _runs_with_records(home: Path) -> list[str]:
    from prudent.record.format import FOLDER

    runs = home / "runs"
    if not runs.is_dir():
        return []
    return sorted(p.name for p in runs.iterdir()
                  if (p / "checkpoints" / FOLDER).is_dir() and any((p / "checkpoints" / FOLDER).iterdir()))


def _run_ids(path: Path) -> list[str]:
    try:
        with _read_only(path) as conn:
            return [row[0] for row in conn.execute("SELECT id FROM runs")]
    except sqlite3.DatabaseError:
        return []


def _count(conn: sqlite3.Connection, table: str) -> int | None:
    return _quiet(lambda: int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]), None)


def _quiet(read: Any, otherwise: Any) -> Any:
    try:
        return read()
    except sqlite3.DatabaseError:
        return otherwise


class _read_only:  # noqa: N801 - used as ``with _read_only(path) as conn``
    """The store opened read-only, closed on leaving (sqlite3's own context manager only
    commits)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def _sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


# the commands ------------------------------------------------------------------------------
store_app = typer.Typer(no_args_is_help=True,
                        help="The run store itself: check it, repair a damaged one.\n\n"
                             "Example: prudent store check")
_ConfigOption = typer.Option(None, "--config", "-c", metavar="FILE",
                             help="Settings file (default: ./prudent.yaml).")
_JsonOption = typer.Option(False, "--json", help="Machine-readable output.")


def _embedded(config: str | None) -> tuple[Path, Path]:
    from prudent.store.database import mask_url
    from prudent.wiring.config import load_settings

    settings = load_settings(config).store
    if settings.url is not None and not settings.url.startswith("sqlite"):
        raise ConfigError(f"store.url {mask_url(settings.url)} is a server store: check and repair "
                          "it with its server's own tools (PostgreSQL: pg_amcheck, a restore)")
    url = settings.database_url()
    return Path(url.removeprefix("sqlite:///")), Path(settings.home)


@store_app.command("check")
def check_command(config: str | None = _ConfigOption, as_json: bool = _JsonOption) -> None:
    """Say whether the embedded store is healthy; exit 1 when it is not.

    Example: prudent store check
    """
    path, home = _embedded(config)
    health = check_store(path, home)
    if as_json:
        typer.echo(json.dumps(health.as_dict(), indent=2))
    elif health.missing and health.ok:
        typer.echo(f"{path}: no run store yet (nothing has run with this home)")
    else:
        counts = ", ".join(f"{table} {'unreadable' if n is None else n}"
                           for table, n in health.rows.items())
        typer.echo(f"{path}: {'healthy' if health.ok else 'damaged'}" + (f" ({counts})" if counts else ""))
        for problem in health.problems:
            typer.echo(f"  {problem}")
        if not health.ok:
            typer.echo("  repair it (every readable row kept, the damaged file kept beside it): "
                       "prudent store repair")
    raise typer.Exit(0 if health.ok else 1)


@store_app.command("repair")
def repair_command(config: str | None = _ConfigOption, as_json: bool = _JsonOption) -> None:
    """Repair a damaged store, keeping every readable row and the damaged file.

    The rows SQLite can still read go into a fresh store. Stop the runs that use it first.

    What the store lost and a run's record beside its checkpoints holds is added back.

    Example: prudent store repair
    """
    path, home = _embedded(config)
    if not path.is_file() and not _runs_with_records(home):
        typer.echo(f"{path}: no run store, and no run records beside checkpoints to rebuild "
                   "one from: nothing to repair")
        return
    result = repair_store(path, home)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    copied = ", ".join(f"{table} {n}" for table, n in result.copied.items())
    lost = sum(result.lost.values())
    added = result.from_records
    typer.echo(f"{path}: repaired; rows copied: {copied or 'none (nothing was readable)'}"
               + (f"; at least {lost} unreadable row(s) left behind" if lost else ""))
    typer.echo(f"  from the runs' records: {added['runs']} run(s), {added['events']} event(s), "
               f"{added['metrics']} metric row(s) added back")
    if result.kept_aside is not None:
        typer.echo(f"  the damaged store is kept as {result.kept_aside}")
