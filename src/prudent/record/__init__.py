"""The run's record travels with its checkpoints: segments and heartbeats written next to them,
imported by a new machine that continues the run (see :mod:`prudent.record.format`).

Exports are loaded on first use: the modules of this package import each other, and the cost
meter needs only :mod:`prudent.record.attempt`.
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = ["ImportResult", "Record", "RecordSync", "merge_into", "read_record"]

__getattr__ = lazy_exports(__name__, {
    "ImportResult": "prudent.record.importer", "Record": "prudent.record.importer",
    "merge_into": "prudent.record.importer", "read_record": "prudent.record.importer",
    "RecordSync": "prudent.record.sync"})
