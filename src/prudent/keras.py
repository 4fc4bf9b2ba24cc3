"""``prudent.keras``: the public import path of :mod:`prudent.adapters.keras`.

Importing it gives that very module (one module object, one set of globals), so a
test that patches either name patches both."""

import sys

from prudent.adapters import keras as _module
from prudent.adapters.keras import PrudentCallback

__all__ = ["PrudentCallback"]

sys.modules[__name__] = _module
