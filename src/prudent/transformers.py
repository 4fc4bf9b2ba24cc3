"""``prudent.transformers``: the public import path of :mod:`prudent.adapters.transformers`.

Importing it gives that very module (one module object, one set of globals), so a
test that patches either name patches both."""

import sys

from prudent.adapters import transformers as _module
from prudent.adapters.transformers import HPARAMS, PrudentCallback

__all__ = ["HPARAMS", "PrudentCallback"]

sys.modules[__name__] = _module
