"""GpuReader: utilisation, memory and power of the visible NVIDIA GPUs, through NVML.

``nvidia-ml-py`` is an optional extra (``pip install 'prudent[gpu]'``). Without it, or
without a GPU or a driver, the reader is empty and says why in :attr:`GpuReader.note`: a
profiler must never fail a run, nor warn on a machine that has no GPU at all.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["GpuReader"]

INSTALL_HINT = "nvidia-ml-py is not installed: pip install 'prudent[gpu]' to record GPU use"


class GpuReader:
    """Reads each visible GPU (``CUDA_VISIBLE_DEVICES`` order, as torch numbers them)."""

    def __init__(self) -> None:
        self.note = ""
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml
        except ImportError:
            self.note = INSTALL_HINT
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # no driver, no GPU: quiet by design
            self.note = f"NVML unavailable ({exc})"
            return
        self._nvml = pynvml
        self._handles = _visible_handles(pynvml)

    @property
    def num_gpus(self) -> int:
        return len(self._handles)

    def position(self, uuid: str) -> int | None:
        """Where the GPU with this UUID is in :meth:`read`'s list (torch may order GPUs
        fastest first, NVML by PCI bus: the UUID is what both agree on)."""
        wanted = uuid.lower().removeprefix("gpu-")
        for index, handle in enumerate(self._handles):
            try:
                found = self._nvml.nvmlDeviceGetUUID(handle)
            except Exception:
                return None
            found = found.decode() if isinstance(found, bytes) else str(found)
            if found.lower().removeprefix("gpu-") == wanted:
                return index
        return None

    def read(self) -> list[dict[str, float | None]]:
        """One dict per GPU: ``util_pct``, ``mem_used_mb``, ``mem_total_mb``, ``power_w``."""
        return [self._read_one(handle) for handle in self._handles]

    def _read_one(self, handle: Any) -> dict[str, float | None]:
        nvml = self._nvml
        out: dict[str, float | None] = {"util_pct": None, "mem_used_mb": None,
                                        "mem_total_mb": None, "power_w": None}
        try:
            out["util_pct"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            out["mem_used_mb"], out["mem_total_mb"] = memory.used / 2**20, memory.total / 2**20
            out["power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except Exception:  # some boards lack power readings; keep what was read
            pass
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml, self._handles = None, []


def _visible_handles(nvml: Any) -> list[Any]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if visible is None:
            return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        handles = []
        for entry in (e.strip() for e in visible.split(",") if e.strip()):
            if entry.isdigit():
                handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
            elif entry.startswith(("GPU-", "MIG-")):
                handles.append(nvml.nvmlDeviceGetHandleByUUID(entry))
            else:
                break  # CUDA stops at the first invalid entry, and so do we
        return handles
    except Exception:
        return []
