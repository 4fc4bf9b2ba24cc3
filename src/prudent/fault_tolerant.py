"""``prudent.fault_tolerant``: the public import path of :mod:`prudent.distributed.fault_tolerant`.

Importing it gives that very module (one module object, one set of globals), so a
test that patches either name patches both."""

import sys

from prudent.distributed import fault_tolerant as _module
from prudent.distributed.fault_tolerant import (
    ENV_LIGHTHOUSE,
    ENV_REPLICA_GROUP,
    MANAGER_KEY,
    MembershipRecorder,
    ReplicaGroup,
    replicate,
)

__all__ = [
    "ENV_LIGHTHOUSE",
    "ENV_REPLICA_GROUP",
    "MANAGER_KEY",
    "MembershipRecorder",
    "ReplicaGroup",
    "replicate",
]

sys.modules[__name__] = _module
