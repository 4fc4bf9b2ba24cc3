"""Who is running this attempt of a run: its id, and the machine's name.

The id tells attempts of a run apart across machines (two machines can reuse a pid, and
cloud VMs often share a hostname). A new attempt begins each time a run starts in this
process (:class:`~prudent.record.RecordSync` begins it; the cost meter writes it in its
``cost/price`` event, which is how every store knows which attempts it already has).
"""

from __future__ import annotations

import secrets
import time

from prudent.launch.spec import host_name

__all__ = ["attempt_id", "begin_attempt", "host_name"]


_CURRENT: dict[str, str] = {}  # run id -> its attempt in this process


def begin_attempt(run_id: str) -> str:
    """A new attempt of ``run_id``, e.g. ``20261203T071500-4f2a9c1e`` (sortable by start)."""
    _CURRENT[run_id] = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"
    return _CURRENT[run_id]


def attempt_id(run_id: str) -> str:
    """The attempt of ``run_id`` in progress in this process (begun now if none is)."""
    return _CURRENT.get(run_id) or begin_attempt(run_id)

