"""``tracking:`` in prudent.yaml: the experiment trackers that also see the run.

    tracking:
      tensorboard: {logdir: runs/tb}
      mlflow: {tracking_uri: http://127.0.0.1:5000, experiment: digits}
      wandb: {project: digits, mode: offline}

A tracker left out (or ``enabled: false``) is not used; each needs its extra
(``pip install prudent[tensorboard]``, ``prudent[mlflow]``, ``prudent[wandb]``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MlflowSettings", "TensorBoardSettings", "TrackingSettings", "WandbSettings"]


class _TrackerSettings(BaseModel):
    """What every tracker's section has: unknown keys are errors, and ``enabled``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="false: keep the section but send nothing.")


class TensorBoardSettings(_TrackerSettings):
    """``tracking.tensorboard``: event files under ``<logdir>/<run id>``."""

    logdir: str = Field("runs", description="TensorBoard's logdir; each run writes a folder "
                        "named after its run id in it (point `tensorboard --logdir` here).")


class MlflowSettings(_TrackerSettings):
    """``tracking.mlflow``: one MLflow run per prudent run, continued on resume."""

    tracking_uri: str | None = Field(None, description="MLflow's tracking URI (null: MLflow's "
                                     "own default, MLFLOW_TRACKING_URI or ./mlruns).")
    experiment: str | None = Field(None, description="Experiment name, created if missing "
                                   "(null: MLflow's default experiment).")


class WandbSettings(_TrackerSettings):
    """``tracking.wandb``: one Weights & Biases run per prudent run, continued on resume."""

    project: str | None = Field(None, description="W&B project (null: W&B's own default, "
                                "WANDB_PROJECT, else 'uncategorized').")
    mode: Literal["online", "offline"] | None = Field(
        None, description="online: send to the W&B server; offline: write the run to local "
        "files only (`wandb sync` uploads them later); null: W&B's own default (WANDB_MODE, "
        "else online).")
    entity: str | None = Field(None, description="W&B entity (user or team; null: yours).")
    dir: str | None = Field(None, description="Folder W&B writes its `wandb/` files in (null: "
                            "W&B's own default, WANDB_DIR, else the working directory).")


class TrackingSettings(BaseModel):
    """``tracking:`` in prudent.yaml: a section per tracker; none configured sends nothing."""

    model_config = ConfigDict(extra="forbid")

    tensorboard: TensorBoardSettings | None = Field(None, description="TensorBoard event files.")
    mlflow: MlflowSettings | None = Field(None, description="An MLflow tracking server or folder.")
    wandb: WandbSettings | None = Field(None, description="A Weights & Biases project.")
    max_buffered_rows: int = Field(
        50_000, ge=1, description="Rows kept per tracker while it does not answer; past this "
        "the oldest are dropped and counted.")
    flush_interval_s: float = Field(1.0, gt=0, description="Seconds between writes to trackers.")
    close_timeout_s: float = Field(
        10.0, ge=0, description="At the run's end, how long a tracker that does not answer is "
        "tried again before what waits for it is dropped.")
