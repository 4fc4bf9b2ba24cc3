"""The price catalog: what an hour of each GPU instance type costs, on demand and on spot.

Three layers, each overriding the one before row by row: the CSV shipped with the package
(``prices.csv``: list prices, each row with its source and the date it was taken); SkyPilot's
own local catalog (``~/.sky/catalogs/<version>/<cloud>/vms.csv``) for each cloud where it is
newer than the bundled rows; and the user's file (``cost.catalog_file``: prudent's columns or a
SkyPilot ``vms.csv``), so negotiated prices and on-premise machines need no code. Names are
``cloud:instance`` (``aws:p4d.24xlarge``), case-insensitive; an unknown name is an error
that lists the closest known ones, because a typo must not silently cost $0.
"""

from __future__ import annotations

import csv
import difflib
import fnmatch
import io
import os
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from prudent.cost.settings import CostSettings
from prudent.kernel.errors import ConfigError

__all__ = ["COLUMNS", "NO_SPOT_MARKET", "Catalog", "InstanceType", "from_skypilot", "load_catalog",
           "write_rows"]

COLUMNS = ("cloud", "instance", "region", "gpu", "num_gpus", "vcpus", "memory_gib",
           "on_demand_usd", "spot_usd", "prices_as_of", "source")
_OPTIONAL = ("prices_as_of", "source")  # older user files lack them
NO_SPOT_MARKET = {"lambda": "Lambda Cloud sells no spot (interruptible) instances"}
_NUMBERS = {"num_gpus": int, "vcpus": int, "memory_gib": float, "on_demand_usd": float}


@dataclass(frozen=True)
class InstanceType:
    """One row of the catalog. Prices are US dollars per instance-hour."""

    cloud: str
    instance: str
    region: str
    gpu: str
    num_gpus: int
    vcpus: int
    memory_gib: float
    on_demand_usd: float
    spot_usd: float | None  # None: no spot price known (user rows may leave it empty)
    prices_as_of: str
    source: str = "bundled"

    @property
    def ref(self) -> str:
        return f"{self.cloud}:{self.instance}"

    def hourly_usd(self, spot: bool) -> float:
        """The price of one node-hour; spot without a known spot price is billed on demand."""
        return self.spot_usd if spot and self.spot_usd is not None else self.on_demand_usd

    @property
    def spot_note(self) -> str | None:
        """Why there is no spot price (None: there is one)."""
        if self.spot_usd is not None:
            return None
        return NO_SPOT_MARKET.get(self.cloud, f"no spot price for {self.ref} in the catalog")

    def as_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, **asdict(self), "spot_note": self.spot_note}


class Catalog:
    """Instance types by ``cloud:instance`` (lower case)."""

    def __init__(self, rows: list[InstanceType]) -> None:
        self._rows = {row.ref.lower(): row for row in rows}

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self, cloud: str | None = None) -> list[InstanceType]:
        chosen = [r for r in self._rows.values() if cloud is None or r.cloud == cloud.lower()]
        return sorted(chosen, key=lambda r: (r.cloud, r.on_demand_usd, r.instance))

    def lookup(self, ref: str) -> InstanceType:
        """``aws:g5.xlarge`` (or a bare ``g5.xlarge`` that only one cloud has) -> its row."""
        key = ref.strip().lower()
        if key in self._rows:
            return self._rows[key]
        if ":" not in key:
            found = [row for k, row in self._rows.items() if k.split(":", 1)[1] == key]
            if len(found) == 1:
                return found[0]
        raise ConfigError(self._unknown(ref))

    def matching(self, pattern: str) -> list[InstanceType]:
        """Rows whose ``cloud:instance`` matches a glob such as ``aws:g5.*`` or ``gcp:a2-*``."""
        return [row for row in self.rows() if matches(row.ref, pattern)]

    def _unknown(self, ref: str) -> str:
        close = difflib.get_close_matches(ref.strip().lower(), list(self._rows), n=3, cutoff=0.5)
        names = [self._rows[k].ref for k in close]
        hint = f"did you mean {', '.join(names)}? " if names else ""
        return (f"unknown instance type {ref!r}: {hint}Write cloud:instance as listed by "
                "`prudent catalog`, or add a row to your own catalog file (cost.catalog_file)")


def matches(ref: str, pattern: str) -> bool:
    """Case-insensitive glob on ``cloud:instance``; a pattern without a cloud matches any cloud."""
    ref, pattern = ref.lower(), pattern.strip().lower()
    if ":" not in pattern:
        ref = ref.split(":", 1)[1]
    return fnmatch.fnmatchcase(ref, pattern)


def load_catalog(cost: CostSettings | str | None = None) -> Catalog:
    """The bundled prices, then SkyPilot's local catalog where newer, then the user's file.

    ``cost``: the run's cost settings (or just ``cost.catalog_file``, the rest default).
    """
    settings = cost if isinstance(cost, CostSettings) else CostSettings(catalog_file=cost)
    text = resources.files("prudent.cost").joinpath("prices.csv").read_text()
    rows = parse_rows(text, "prices.csv (bundled)")
    rows += _skypilot_rows(settings, rows)
    if settings.catalog_file:
        rows += _user_rows(settings.catalog_file, settings)
    return Catalog(rows)


def _skypilot_home(settings: CostSettings) -> Path:
    return Path(settings.skypilot_home or Path.home() / ".sky").expanduser()


def _skypilot_rows(settings: CostSettings, bundled: list[InstanceType]) -> list[InstanceType]:
    """Rows of each SkyPilot local catalog that is newer than that cloud's bundled prices."""
    from prudent.cost.skypilot import local_catalogs

    if not settings.skypilot_catalogs:
        return []
    rows: list[InstanceType] = []
    for cloud, path in local_catalogs(_skypilot_home(settings)).items():
        dates = [r.prices_as_of for r in bundled if r.cloud == cloud and r.prices_as_of]
        if dates and path.stat().st_mtime <= _midnight_utc(max(dates)):
            continue  # the bundled prices are as new
        try:
            rows += from_skypilot(path, cloud, settings.regions.get(cloud))
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or set cost.skypilot_catalogs: false to ignore "
                              "SkyPilot's local catalog)") from None
    return rows


def _midnight_utc(day: str) -> float:
    return datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp()


def _user_rows(user_file: str, settings: CostSettings) -> list[InstanceType]:
    from prudent.cost.skypilot import cloud_of, is_skypilot

    try:
        user_text = Path(user_file).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read catalog file {user_file!r}: {exc.strerror}; fix "
                          "cost.catalog_file") from None
    if is_skypilot(user_text):
        path = Path(user_file)
        return from_skypilot(path, region=settings.regions.get(cloud_of(path) or ""))
    return parse_rows(user_text, user_file, source=user_file)


def from_skypilot(path: Path, cloud: str | None = None, region: str | None = None,
                  as_of: str | None = None) -> list[InstanceType]:
    """The GPU rows of a SkyPilot ``vms.csv`` (see :mod:`prudent.cost.skypilot`)."""
    from prudent.cost.skypilot import read_skypilot

    return [InstanceType(**fields) for fields in read_skypilot(path, cloud, region, as_of)]


def write_rows(rows: list[InstanceType], path: Path, comment: str) -> None:
    """``rows`` as a prudent catalog CSV at ``path``, atomically: all or nothing is written."""
    lines = io.StringIO()
    lines.write("".join(f"# {line}\n" for line in comment.splitlines()))
    writer = csv.writer(lines, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if (v := getattr(row, c)) is None else str(v) for c in COLUMNS])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(lines.getvalue())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_rows(text: str, where: str, source: str = "bundled") -> list[InstanceType]:
    """CSV text (``#`` lines are comments) -> validated rows; a bad row names its line."""
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(line for _, line in numbered)))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or []) and c not in _OPTIONAL]
    if missing:
        raise ConfigError(f"{where}: missing column(s) {', '.join(missing)}; the header must be "
                          f"{','.join(COLUMNS)}")
    return [_row(record, f"{where} line {n}", source)
            for (n, _), record in zip(numbered[1:], reader)]


def _row(record: dict[str, Any], where: str, source: str) -> InstanceType:
    values: dict[str, Any] = {c: (record.get(c) or "").strip() for c in COLUMNS}
    values["source"] = values["source"] or source
    if not values["cloud"] or not values["instance"]:
        raise ConfigError(f"{where}: cloud and instance must not be empty, got {record!r}")
    values["cloud"] = values["cloud"].lower()
    for column, kind in _NUMBERS.items():
        values[column] = _number(values[column], kind, column, where)
    spot = values["spot_usd"]
    values["spot_usd"] = _number(spot, float, "spot_usd", where) if spot else None
    return InstanceType(**values)


def _number(text: str, kind: type, column: str, where: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{where}: {column}={text!r} is not a number; fix the row") from None
    if value < 0:
        raise ConfigError(f"{where}: {column}={text!r} is negative; prices and sizes are >= 0")
    return value
