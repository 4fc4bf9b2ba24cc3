"""The price catalog: what an hour of each GPU instance type costs, on demand and on spot.

A plain CSV ships with the package (``prices.csv``: list prices and the date they were
taken); a user's own CSV in the same columns adds rows or overrides them, so negotiated
prices and on-premise machines at an internal rate need no code. Names are
``cloud:instance`` (``aws:p4d.24xlarge``), case-insensitive; an unknown name is an error
that lists the closest known ones, because a typo must not silently cost $0.
"""

from __future__ import annotations

import csv
import difflib
import fnmatch
import io
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from prudent.errors import ConfigError

__all__ = ["COLUMNS", "Catalog", "InstanceType", "load_catalog"]

COLUMNS = ("cloud", "instance", "region", "gpu", "num_gpus", "vcpus", "memory_gib",
           "on_demand_usd", "spot_usd", "prices_as_of")
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

    def as_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, **asdict(self)}


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


def load_catalog(user_file: str | None = None) -> Catalog:
    """The bundled prices, with the rows of ``user_file`` added or overriding them."""
    text = resources.files("prudent.cost").joinpath("prices.csv").read_text()
    rows = parse_rows(text, "prices.csv (bundled)")
    if user_file:
        try:
            user_text = Path(user_file).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read catalog file {user_file!r}: {exc.strerror}; fix "
                              "cost.catalog_file") from None
        rows += parse_rows(user_text, user_file, source=user_file)
    return Catalog(rows)


def parse_rows(text: str, where: str, source: str = "bundled") -> list[InstanceType]:
    """CSV text (``#`` lines are comments) -> validated rows; a bad row names its line."""
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(line for _, line in numbered)))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or []) and c != "prices_as_of"]
    if missing:
        raise ConfigError(f"{where}: missing column(s) {', '.join(missing)}; the header must be "
                          f"{','.join(COLUMNS)}")
    return [_row(record, f"{where} line {n}", source)
            for (n, _), record in zip(numbered[1:], reader)]


def _row(record: dict[str, Any], where: str, source: str) -> InstanceType:
    values: dict[str, Any] = {c: (record.get(c) or "").strip() for c in COLUMNS}
    if not values["cloud"] or not values["instance"]:
        raise ConfigError(f"{where}: cloud and instance must not be empty, got {record!r}")
    values["cloud"] = values["cloud"].lower()
    for column, kind in _NUMBERS.items():
        values[column] = _number(values[column], kind, column, where)
    spot = values["spot_usd"]
    values["spot_usd"] = _number(spot, float, "spot_usd", where) if spot else None
    return InstanceType(**values, source=source)


def _number(text: str, kind: type, column: str, where: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{where}: {column}={text!r} is not a number; fix the row") from None
    if value < 0:
        raise ConfigError(f"{where}: {column}={text!r} is negative; prices and sizes are >= 0")
    return value
