"""``cost:`` and ``policy:`` in prudent.yaml: where the run is, what it may spend, the rules.

``cost`` is the run's own (flags ``--instance --spot --nodes --budget-usd --max-hours``,
variables ``PRUDENT_INSTANCE`` ...); ``policy`` is the project's, usually written by whoever
pays, and may also come from a separate file (``--policy FILE``, ``PRUDENT_POLICY``) holding
the same keys at the top level.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prudent.kernel.errors import ConfigError
from prudent.kernel.units import parse_duration_s, parse_hours, parse_usd

__all__ = ["CostSettings", "PolicySettings"]

Usd = float | str
JobKind = Literal["run", "tune"]


def _usd(value: Any, what: str) -> Any:
    return _checked(parse_usd, value, what)


def _hours(value: Any, what: str) -> Any:
    return _checked(parse_hours, value, what)


def _checked(parse: Any, value: Any, what: str) -> Any:
    """Validate with the one parser, keeping only its reason: pydantic names key and value."""
    if value is None:
        return value
    try:
        parse(value, what)
    except ConfigError as exc:
        raise ValueError(str(exc).split(" is invalid: ", 1)[-1]) from None
    return value


class CostSettings(BaseModel):
    """``cost:`` in prudent.yaml."""

    model_config = ConfigDict(extra="forbid")

    instance: str | None = Field(None, description="Where the run runs, as cloud:instance "
                                 "(aws:g5.xlarge); PRUDENT_INSTANCE, --instance. None: $0.")
    spot: bool = Field(False, description="Billed at the catalog's spot price (PRUDENT_SPOT, --spot).")
    nodes: int = Field(1, ge=1, description="Machines in the job; the price is per node "
                        "(PRUDENT_NODES, --nodes).")
    hourly_usd: Usd | None = Field(None, description="Price of one node-hour, overriding the "
                                   "catalog (an on-premise machine at an internal rate).")
    catalog_file: str | None = Field(None, description="Your own CSV of prices, in the bundled "
                                     "columns or a SkyPilot <cloud>/vms.csv: adds rows and "
                                     "overrides bundled ones.")
    regions: dict[str, str] = Field(default_factory=dict, description="Region a SkyPilot "
                                    "catalog is priced in, per cloud ({aws: us-west-2}); "
                                    "default the cloud's reference region.")
    skypilot_catalogs: bool = Field(True, description="Use SkyPilot's local catalog "
                                    "(<skypilot_home>/catalogs/<version>/<cloud>/vms.csv) for "
                                    "each cloud where it is newer than the bundled prices.")
    skypilot_home: str | None = Field(None, description="Where SkyPilot keeps its catalogs; "
                                      "None: ~/.sky.")
    stale_after_days: int = Field(180, ge=1, description="Warn when a run is priced at a price "
                                  "older than this (at start, in `prudent cost`, in preflight).")
    budget_usd: Usd | None = Field(None, description="Stop (checkpointed, resumable) before the "
                                   "run's total cost over all attempts passes this, e.g. '$40'.")
    max_hours: Usd | None = Field(None, description="Stop (checkpointed, resumable) before the "
                                  "run's wall time over all attempts passes this: 12 or '90min'.")
    stop_margin: str = Field("30s", description="Stop this long before a limit, to leave time "
                             "for the last step and the checkpoint.")
    update_interval_s: float = Field(10.0, gt=0, description="How often the stored cost_usd is "
                                     "updated (from a background thread).")
    policy_file: str | None = Field(None, description="A policy file replacing the policy: "
                                    "section (PRUDENT_POLICY, --policy).")
    detect: Literal["auto", "on", "off"] = Field("auto", description="Ask the cloud's metadata "
                                                 "service (preemption.metadata_url) for the "
                                                 "instance type when none is given; auto: only "
                                                 "when DMI says this is AWS, GCP or Azure.")

    @field_validator("detect", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        # YAML 1.1 reads a bare `on` / `off` as true / false
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("budget_usd", "hourly_usd")
    @classmethod
    def _valid_usd(cls, value: Any, info: Any) -> Any:
        return _usd(value, info.field_name)

    @field_validator("max_hours")
    @classmethod
    def _valid_hours(cls, value: Any) -> Any:
        return _hours(value, "max_hours")

    @field_validator("stop_margin")
    @classmethod
    def _valid_margin(cls, value: str) -> str:
        parse_duration_s(value)
        return value


class PolicySettings(BaseModel):
    """``policy:`` in prudent.yaml (or a --policy file): what any job in the project may do.

    Every key is off (None or empty) by default. Checked before ``prudent run`` launches;
    the time and money limits are also enforced while the run goes (stop reason ``policy``).
    """

    model_config = ConfigDict(extra="forbid")

    allowed_instances: list[str] | None = Field(None, description="Globs on cloud:instance, "
                                                "e.g. ['aws:g5.*', 'gcp:g2-*']; None: any.")
    max_gpus_per_job: int | None = Field(None, ge=0, description="GPUs per job, all nodes "
                                         "together.")
    max_hours_per_job: Usd | None = Field(None, description="Wall hours per job over all its "
                                          "attempts: 12 or '90min'.")
    max_hourly_usd: Usd | None = Field(None, description="Price per hour of the whole job "
                                       "(all nodes, spot price when on spot).")
    max_parallel_trials: int | None = Field(None, ge=1, description="Trials of a tuning study "
                                            "running at once.")
    require_spot: list[JobKind] | bool = Field(False, description="Kinds of job that must run "
                                               "on spot: [run, tune], or true for all.")
    max_usd_per_job: Usd | None = Field(None, description="Dollars per job over all attempts.")
    max_usd_per_day: Usd | None = Field(None, description="Dollars per UTC day, all runs of "
                                        "the project (their stored cost) together.")
    max_usd_per_month: Usd | None = Field(None, description="Dollars per UTC calendar month, "
                                          "all runs of the project together.")

    @field_validator("max_usd_per_job", "max_usd_per_day", "max_usd_per_month", "max_hourly_usd")
    @classmethod
    def _valid_usd(cls, value: Any, info: Any) -> Any:
        return _usd(value, info.field_name)

    @field_validator("max_hours_per_job")
    @classmethod
    def _valid_hours(cls, value: Any) -> Any:
        return _hours(value, "max_hours_per_job")

    def spot_required(self, kind: str) -> bool:
        return self.require_spot is True or (
            isinstance(self.require_spot, list) and kind in self.require_spot)
