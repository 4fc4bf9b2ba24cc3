"""SkyPilot's price catalogs (``vms.csv``) read as prudent catalog rows (as the fields of
:class:`~prudent.cost.catalog.InstanceType`, which :func:`prudent.cost.catalog.from_skypilot`
builds: this module knows SkyPilot's format, not the catalog).

SkyPilot keeps one ``vms.csv`` per cloud (``~/.sky/catalogs/<version>/<cloud>/vms.csv``,
refreshed by SkyPilot itself): one row per instance type, region and zone, columns
``InstanceType, AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB, GpuInfo, Price,
SpotPrice, Region, AvailabilityZone`` (schema v7; v9 adds columns, which are ignored). One
region is read (``cost.regions``, default the cloud's reference region); spot is the lowest
over that region's zones. The file carries no date, so its rows are dated by its mtime.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prudent.kernel.errors import ConfigError

__all__ = ["REFERENCE_REGIONS", "cloud_of", "is_skypilot", "local_catalogs", "read_skypilot"]

REQUIRED = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB",
            "Price", "Region")
REFERENCE_REGIONS = {"aws": "us-east-1", "azure": "eastus", "gcp": "us-central1",
                     "lambda": "us-east-1", "nebius": "eu-north1", "runpod": "US"}
# SkyPilot's GCP vms.csv prices the VM without its GPUs (those are in accelerators.csv)
NOT_READABLE = {"gcp": "SkyPilot's GCP catalog prices the GPU apart from the VM "
                       "(accelerators.csv), which prudent does not read"}
_FIX = "fix the row, or refresh the file (SkyPilot rewrites ~/.sky/catalogs; `sky check`)"


def is_skypilot(text: str) -> bool:
    """Whether CSV text has SkyPilot's header (``InstanceType``, ``Price`` ...)."""
    header = next((line for line in text.splitlines() if line.strip()), "")
    return "InstanceType" in header.split(",")


def cloud_of(path: Path) -> str | None:
    """``aws`` for ``catalogs/v7/aws/vms.csv`` (SkyPilot's layout) or ``aws/vms.csv``; None
    when the path does not say."""
    folder = path.resolve().parent
    name = folder.name.lower()
    if name in REFERENCE_REGIONS or re.fullmatch(r"v\d+", folder.parent.name):
        return name
    return None


def local_catalogs(home: Path) -> dict[str, Path]:
    """Each cloud's ``vms.csv`` under SkyPilot's ``home`` (``~/.sky``), newest schema first."""
    found: dict[str, tuple[int, Path]] = {}
    for path in home.glob("catalogs/v*/*/vms.csv"):
        version = path.parent.parent.name[1:]
        cloud = path.parent.name.lower()
        if version.isdigit() and cloud not in NOT_READABLE and int(version) > found.get(
                cloud, (-1, path))[0]:
            found[cloud] = (int(version), path)
    return {cloud: path for cloud, (_, path) in sorted(found.items())}


def read_skypilot(path: Path, cloud: str | None = None, region: str | None = None,
                  as_of: str | None = None, source: str | None = None) -> list[dict[str, Any]]:
    """The GPU instance types of one SkyPilot ``vms.csv``, priced in one region.

    ``region`` None: per type, the cloud's reference region where it is offered, else the
    first region that offers it. A malformed file, an unknown region or a type without a
    price is a :class:`ConfigError` naming the file, the line and the fix.
    """
    cloud = (cloud or cloud_of(path) or "").lower()
    if not cloud:
        raise ConfigError(f"{path}: which cloud's prices are these? Keep the file as "
                          "<cloud>/vms.csv (SkyPilot's layout) or pass --cloud aws")
    if cloud in NOT_READABLE:
        raise ConfigError(f"{path}: {NOT_READABLE[cloud]}; add {cloud} rows to your own "
                          "catalog file (cost.catalog_file) instead")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read SkyPilot catalog {path}: {exc.strerror}; fix the "
                          "path") from None
    records = _records(text, path)
    chosen = _regions(records, cloud, region, path)
    as_of = as_of or _mtime_date(path)
    rows = [_row(cloud, name, chosen[name], as_of, source or f"skypilot:{path}", path)
            for name in chosen]
    return [row for row in rows if row is not None]


def _records(text: str, path: Path) -> list[tuple[int, dict[str, str]]]:
    """(line, record) for every GPU row; the header and each row's shape are checked."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{path} line 1: not a SkyPilot vms.csv, missing column(s) "
                          f"{', '.join(missing)}; fix: give the file SkyPilot's header "
                          f"({', '.join(REQUIRED)}, SpotPrice, AvailabilityZone)")
    found = []
    for record in reader:
        line = reader.line_num
        if None in record or None in record.values():
            raise ConfigError(f"{path} line {line}: {len(reader.fieldnames or [])} columns in "
                              f"the header but not in this row; {_FIX}")
        if record["AcceleratorName"].strip():
            found.append((line, {k: v.strip() for k, v in record.items()}))
    return found


Zones = list[tuple[int, dict[str, str]]]


def _regions(records: Zones, cloud: str, region: str | None, path: Path) -> dict[str, Zones]:
    """Each instance type's rows in the one region it is priced in."""
    by_type: dict[str, dict[str, Zones]] = defaultdict(lambda: defaultdict(list))
    for line, record in records:
        by_type[record["InstanceType"]][record["Region"]].append((line, record))
    if region is not None:
        known = sorted({r for regions in by_type.values() for r in regions})
        if region not in known:
            shown = ", ".join(known[:8]) + (" ..." if len(known) > 8 else "")
            raise ConfigError(f"{path}: unknown region {region!r} for {cloud} (the file has "
                              f"{shown or 'no GPU rows'}); fix cost.regions.{cloud} or --region")
        return {name: regions[region] for name, regions in by_type.items() if region in regions}
    reference = REFERENCE_REGIONS.get(cloud)
    return {name: regions[reference] if reference in regions else regions[min(regions)]
            for name, regions in by_type.items()}


def _row(cloud: str, name: str, zones: Zones, as_of: str, source: str,
         path: Path) -> dict[str, Any] | None:
    line, first = zones[0]
    count = _number(first, "AcceleratorCount", path, line)
    if count is None or not count.is_integer() or count < 1:
        return None  # a fraction of a GPU (aws g6f): prudent counts whole GPUs
    prices = [(n, p) for n, r in zones if (p := _number(r, "Price", path, n)) is not None]
    if not prices:
        raise ConfigError(f"{path} line {line}: {name} in {first['Region']} has no Price; "
                          f"{_FIX}, or choose another region (cost.regions.{cloud})")
    spots = [s for n, r in zones if (s := _number(r, "SpotPrice", path, n)) is not None]
    return {
        "cloud": cloud, "instance": name, "region": first["Region"],
        "gpu": first["AcceleratorName"], "num_gpus": int(count),
        "vcpus": round(_number(first, "vCPUs", path, line) or 0),
        "memory_gib": _number(first, "MemoryGiB", path, line) or 0.0,
        # on demand is one price per region; should zones differ, the higher keeps budgets safe
        "on_demand_usd": max(p for _, p in prices),
        "spot_usd": min(spots) if spots else None, "prices_as_of": as_of, "source": source}


def _number(record: dict[str, Any], column: str, path: Path, line: int) -> float | None:
    text = record.get(column) or ""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{path} line {line}: {column}={text!r} is not a number; "
                          f"{_FIX}") from None
    if value < 0 or value != value:
        raise ConfigError(f"{path} line {line}: {column}={text!r} must be a number >= 0; {_FIX}")
    return value


def _mtime_date(path: Path) -> str:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).date().isoformat()
