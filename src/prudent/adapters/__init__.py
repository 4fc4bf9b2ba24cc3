"""What the framework adapters share (``prudent.lightning``, ``prudent.transformers``,
``prudent.keras``): :class:`AdapterRun`, the framework-neutral half of every callback, and
:class:`FrameworkCheckpoint`, the framework's own checkpoint carried inside prudent's.

Imported on first use: the command line must not pay for torch.
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = ["AdapterRun", "FrameworkCheckpoint"]

__getattr__ = lazy_exports(__name__, {"AdapterRun": "prudent.adapters.core",
                                      "FrameworkCheckpoint": "prudent.adapters.files"})
