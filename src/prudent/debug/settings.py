"""``debug:`` in prudent.yaml: debug mode and failure capture.

::

    debug:
      enabled: false          # debug mode (PRUDENT_DEBUG=1, prudent run --debug)
      capture: true           # write a bundle when a step fails
      on_non_finite: auto     # every step on CPU; on a GPU only in debug mode or 'always'
      check_gradients: false  # also catch a NaN gradient under a finite loss (on in debug mode)
      max_bytes: 1GB          # a bigger bundle leaves the largest state out, and says so
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DebugSettings", "parse_bytes"]

_BYTES = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_bytes(value: str | int) -> int:
    """``"512MB"``, ``"1GB"``, ``"2GiB"`` or a number of bytes, as bytes (1 GB = 1e9 bytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _BYTES.match(str(value))
    if not match:
        raise ValueError(f"size {value!r} is invalid: write a number with a unit, e.g. '512MB', "
                         "'2GB'")
    unit = match.group(2).lower()
    base = 1024 if "i" in unit else 1000
    return int(float(match.group(1)) * base ** _POWERS[unit[:1] if unit[:1] != "b" else ""])


class DebugSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Debug mode: every event logged to stderr, autograd "
                          "anomaly detection, deterministic algorithms, and a capture on every "
                          "rule firing. Slow: for finding a bug, not for training.")
    capture: bool = Field(True, description="Write a failure bundle (batch, state before the "
                          "update, RNG, stack, config) to <run folder>/captures/ when a step "
                          "raises, a loss or gradient is not finite, or a rule asks for it.")
    on_error: bool = Field(True, description="Capture when the training loop raises.")
    on_non_finite: Literal["auto", "always", "off"] = Field(
        "auto", description="Check the loss after every backward and capture the first "
        "non-finite step, before the optimizer changes the weights. auto: when the loss is on "
        "the CPU (reading it is free) or in debug mode; not on a GPU, where it would be one host "
        "sync per step (the monitor's non_finite rule still stops the run at its next check). "
        "always: also on a GPU.")
    check_gradients: bool = Field(False, description="Also check every gradient after each "
                                  "backward (a norm over all of them, ~the cost of the monitor's "
                                  "gradient norm), so a NaN gradient under a finite loss is "
                                  "captured before the update. Always on in debug mode.")
    max_bytes: int | str = Field("1GB", validate_default=True, description="The most a bundle "
                                 "may hold; above it the "
                                 "largest attached objects (optimizer first) are left out, and the "
                                 "bundle says which.")
    keep: int = Field(5, ge=1, description="The most bundles one run writes (one per failure).")

    @field_validator("max_bytes")
    @classmethod
    def _valid_size(cls, value: int | str) -> int:
        size = parse_bytes(value)
        if size < 1_000_000:
            raise ValueError(f"max_bytes must be at least 1MB, got {value!r}: a bundle needs room "
                             "for the batch")
        return size
