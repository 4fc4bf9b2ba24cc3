"""``checkpoint:`` in prudent.yaml."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prudent.kernel.units import parse_duration_s, parse_interval

__all__ = ["CheckpointSettings"]


class CheckpointSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Save checkpoints and resume from them.")
    every: str = Field("auto", description="'500steps', '10min', '1epoch', 'off', or 'auto': the "
                       "Young/Daly interval from the measured save cost and mtbi.")
    at_epoch_end: bool = Field(True, description="Also save when an epoch ends (under every: "
                               "auto, only where that save blocks the loop for at most ~1% of "
                               "the time since the last save: tiny epochs are not each saved).")
    on_stop: bool = Field(True, description="Save when the run is asked to stop (preemption, "
                          "budget, a rule), before it exits.")
    keep: int = Field(2, description="How many verified checkpoints to keep (>= 1).")
    mode: str = Field("async", description="async: the loop only copies tensors to host memory; "
                      "sync: the loop waits for the write.")
    url: str | None = Field(None, description="Folder or fsspec URL (s3://bucket/prefix); "
                            "{run_id} in it is the run's id (one URL for many runs); "
                            "default <run folder>/checkpoints (/opt/ml/checkpoints on SageMaker).")
    mtbi: str = Field("6h", description="Mean time between interruptions, for every: auto.")
    heartbeat_interval: str = Field("60s", description="How often a small heartbeat (attempt, "
                                    "host, last seen, spend) is written next to the checkpoints, "
                                    "so a machine that vanishes is billed up to it; 'off' for none.")
    strict_resume: bool = Field(False, description="Refuse to start when checkpoints exist but "
                                "none is readable (default: warn and start fresh).")

    @field_validator("keep")
    @classmethod
    def _keep_at_least_one(cls, keep: int) -> int:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got keep={keep}: prudent never deletes the "
                             "only checkpoint")
        return keep

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        if mode not in ("async", "sync"):
            raise ValueError("allowed: async, sync")
        return mode

    @field_validator("every")
    @classmethod
    def _valid_interval(cls, every: str) -> str:
        parse_interval(every)
        return every

    @field_validator("heartbeat_interval")
    @classmethod
    def _valid_heartbeat(cls, interval: str) -> str:
        if interval.strip().lower() != "off" and parse_duration_s(interval) <= 0:
            raise ValueError("must be positive, e.g. '60s', or 'off'")
        return interval

    def location(self, run_id: str, default: str) -> str:
        """Where run ``run_id`` keeps its checkpoints and record: ``url`` with ``{run_id}``
        replaced (one URL for many runs: ``s3://bucket/runs/{run_id}``), else ``default``."""
        return self.url.replace("{run_id}", run_id) if self.url else default

    def heartbeat_interval_s(self) -> float | None:
        """Seconds between heartbeats; None when they are off."""
        text = self.heartbeat_interval.strip().lower()
        return None if text == "off" else parse_duration_s(text)

    @field_validator("mtbi")
    @classmethod
    def _valid_mtbi(cls, mtbi: str) -> str:
        if parse_duration_s(mtbi) <= 0:
            raise ValueError("must be positive, e.g. '6h'")
        return mtbi
