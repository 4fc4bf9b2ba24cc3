"""Which cloud this machine is on, read from DMI (no network call): the notice to poll and
the instance type to price."""

from __future__ import annotations

from pathlib import Path

__all__ = ["detect_cloud"]

_DMI = ("/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/board_vendor",
        "/sys/class/dmi/id/product_name")


def detect_cloud(dmi_files: tuple[str, ...] = _DMI) -> str | None:
    """``aws``, ``gcp``, ``azure`` or None."""
    text = " ".join(_read(path) for path in dmi_files).lower()
    if "amazon" in text:
        return "aws"
    if "google" in text:
        return "gcp"
    if "microsoft" in text:
        return "azure"
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
