"""``prudent.lightning``: the public import path of :mod:`prudent.adapters.lightning`.

Importing it gives that very module (one module object, one set of globals), so a
test that patches either name patches both."""

import sys

from prudent.adapters import lightning as _module
from prudent.adapters.lightning import PrudentCallback, ResumableLoader, resumable, resume_path

__all__ = ["PrudentCallback", "ResumableLoader", "resumable", "resume_path"]

sys.modules[__name__] = _module
