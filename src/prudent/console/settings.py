"""``console:`` in prudent.yaml: what a person watching the run sees, and how often."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConsoleSettings"]


class ConsoleSettings(BaseModel):
    """``console:`` in prudent.yaml (PRUDENT_CONSOLE overrides ``mode``)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "rich", "plain", "off"] = Field(
        "auto", description="auto: a progress bar on a terminal, plain lines otherwise.")
    interval_s: float = Field(10.0, gt=0, description="Seconds between plain progress lines.")
