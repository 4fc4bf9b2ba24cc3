"""``preemption:`` in prudent.yaml: whether and how to watch for the cloud's notice."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["PreemptionSettings"]


class PreemptionSettings(BaseModel):
    """``preemption:`` in prudent.yaml (PRUDENT_METADATA_URL overrides ``metadata_url``)."""

    model_config = ConfigDict(extra="forbid")

    watch: Literal["auto", "on", "off"] = Field("auto", description="auto: watch when running "
                                                "on AWS, GCP or Azure (detected from DMI).")
    cloud: Literal["auto", "aws", "gcp", "azure"] = Field("auto", description="Which notice to "
                                                         "poll; auto: the detected cloud, else all.")
    metadata_url: str = Field("http://169.254.169.254", description="Base URL of the metadata "
                              "service (tests point it at a local server).")
    poll_interval_s: float = Field(5.0, gt=0, description="Seconds between polls (AWS advises 5).")
    timeout_s: float = Field(1.0, gt=0, description="Timeout of one metadata request.")

    @field_validator("watch", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        # YAML 1.1 reads a bare `on` / `off` as true / false
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
