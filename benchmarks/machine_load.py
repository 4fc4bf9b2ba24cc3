"""How busy the machine was: the benchmarks report other processes' load next to their figures."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_busy_s() -> float | None:
    """CPU seconds all processes have used since boot, from /proc/stat (None elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
