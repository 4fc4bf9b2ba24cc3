"""The cost policy: a job checked against the project's rules before a cent is spent.

Each rule is a small function ``(policy, job, spend) -> Violation | None`` whose message names
the rule, the numbers and what would comply. A rule that needs a number the job does not state
(no instance, no hours) passes here and is enforced while the run goes instead (see
:mod:`prudent.cost.budget`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pydantic import ValidationError

from prudent.cost.catalog import Catalog, InstanceType, matches
from prudent.cost.settings import CostSettings, PolicySettings
from prudent.kernel.errors import ConfigError, PrudentError
from prudent.kernel.units import parse_hours, parse_usd

if TYPE_CHECKING:
    from prudent.store.database import Store
    from prudent.wiring.config import ProjectSettings

__all__ = ["Job", "PolicyViolation", "Spend", "Violation", "check_job", "job_from_settings",
           "load_policy", "project_spend"]


class PolicyViolation(PrudentError):
    """The job breaks the policy: refused before launch (exit code 6)."""


@dataclass(frozen=True)
class Job:
    """What is about to run: where, how big, how long, for how much."""

    kind: str = "run"
    instance: InstanceType | None = None
    spot: bool = False
    nodes: int = 1
    gpus: int | None = None  # all nodes; None: from the instance type
    hours: float | None = None
    budget_usd: float | None = None
    parallel: int = 1
    node_hourly_usd: float | None = None  # overrides the catalog price of one node

    @property
    def num_gpus(self) -> int:
        if self.gpus is not None:
            return self.gpus
        return self.instance.num_gpus * self.nodes if self.instance else 0

    @property
    def hourly_usd(self) -> float:
        """The whole job's price per hour (all nodes, spot price on spot)."""
        node = self.node_hourly_usd
        if node is None:
            node = self.instance.hourly_usd(self.spot) if self.instance else 0.0
        return node * self.nodes * max(1, self.parallel)

    @property
    def projected_usd(self) -> float | None:
        return self.hourly_usd * self.hours if self.hours is not None else None

    def describe(self) -> str:
        where = self.instance.ref if self.instance else "no instance"
        price = f"${self.hourly_usd:.2f}/h ({where} {'spot' if self.spot else 'on-demand'}"
        return price + f" x {self.nodes} node{'s' * (self.nodes != 1)})"


@dataclass(frozen=True)
class Spend:
    """Dollars the project already spent in the policy's windows (stored run costs)."""

    day_usd: float = 0.0
    month_usd: float = 0.0


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str


Rule = Callable[[PolicySettings, Job, Spend, Catalog | None], "Violation | None"]


def _allowed_instances(policy: PolicySettings, job: Job, spend: Spend,
                       catalog: Catalog | None) -> Violation | None:
    allowed = policy.allowed_instances
    if allowed is None or job.instance is None or any(matches(job.instance.ref, p) for p in allowed):
        return None
    options = [r for p in allowed for r in (catalog.matching(p) if catalog else [])]
    example = f", e.g. --instance {min(options, key=lambda r: r.on_demand_usd).ref}" if options else ""
    return Violation("allowed_instances", f"instance {job.instance.ref} is not allowed by "
                     f"policy allowed_instances ({', '.join(allowed)}): pick a matching "
                     f"instance type{example}")


def _max_gpus(policy: PolicySettings, job: Job, spend: Spend,
              catalog: Catalog | None) -> Violation | None:
    limit = policy.max_gpus_per_job
    if limit is None or job.num_gpus <= limit:
        return None
    return Violation("max_gpus_per_job", f"{job.num_gpus} GPUs exceed policy "
                     f"max_gpus_per_job={limit}: use at most {limit} GPUs (fewer nodes, fewer "
                     "processes per node or a smaller instance type)")


def _max_hours(policy: PolicySettings, job: Job, spend: Spend,
               catalog: Catalog | None) -> Violation | None:
    if policy.max_hours_per_job is None or job.hours is None:
        return None
    limit = parse_hours(policy.max_hours_per_job)
    if job.hours <= limit:
        return None
    return Violation("max_hours_per_job", f"{job.hours:g} h exceed policy max_hours_per_job="
                     f"{limit:g} h: ask for at most {limit:g} h (--max-hours {limit:g})")


def _max_hourly(policy: PolicySettings, job: Job, spend: Spend,
                catalog: Catalog | None) -> Violation | None:
    if policy.max_hourly_usd is None:
        return None
    limit = parse_usd(policy.max_hourly_usd)
    if job.hourly_usd <= limit:
        return None
    spot = ""
    if not job.spot and job.instance is not None and job.instance.spot_usd is not None:
        spot = f", or --spot (${job.instance.spot_usd * job.nodes:.2f}/h)"
    return Violation("max_hourly_usd", f"{job.describe()} exceeds policy max_hourly_usd "
                     f"${limit:.2f}/h: pick a cheaper instance or fewer nodes{spot}")


def _max_parallel(policy: PolicySettings, job: Job, spend: Spend,
                  catalog: Catalog | None) -> Violation | None:
    limit = policy.max_parallel_trials
    if limit is None or job.parallel <= limit:
        return None
    return Violation("max_parallel_trials", f"{job.parallel} parallel trials exceed policy "
                     f"max_parallel_trials={limit}: run at most {limit} at once")


def _require_spot(policy: PolicySettings, job: Job, spend: Spend,
                  catalog: Catalog | None) -> Violation | None:
    if job.spot or job.instance is None or not policy.spot_required(job.kind):
        return None
    fix = "add --spot"
    if job.instance.spot_note:
        options = [r for r in (catalog.rows() if catalog else []) if r.spot_usd is not None
                   and r.gpu == job.instance.gpu and r.num_gpus == job.instance.num_gpus]
        fix = (f"{job.instance.spot_note}, so pick a type with a spot price"
               + (f", e.g. --instance {min(options, key=lambda r: r.spot_usd or 0).ref} --spot"
                  if options else ""))
    return Violation("require_spot", f"policy require_spot says {job.kind} jobs run on spot, "
                     f"but {job.instance.ref} was asked for on demand: {fix}")


def _max_per_job(policy: PolicySettings, job: Job, spend: Spend,
                 catalog: Catalog | None) -> Violation | None:
    if policy.max_usd_per_job is None:
        return None
    limit = parse_usd(policy.max_usd_per_job)
    if job.budget_usd is not None and job.budget_usd > limit:
        return Violation("max_usd_per_job", f"budget ${job.budget_usd:.2f} exceeds policy "
                         f"max_usd_per_job ${limit:.2f}: use --budget-usd {limit:g} or less")
    projected = job.projected_usd
    if projected is None or projected <= limit:
        return None
    return Violation("max_usd_per_job", f"projected ${projected:.2f} ({job.hours:g} h at "
                     f"{job.describe()}) exceeds policy max_usd_per_job ${limit:.2f}: "
                     f"{_affordable(limit, job)}")


def _window(name: str) -> Rule:
    def rule(policy: PolicySettings, job: Job, spend: Spend,
             catalog: Catalog | None) -> Violation | None:
        raw = getattr(policy, f"max_usd_per_{name}")
        if raw is None:
            return None
        limit, already = parse_usd(raw), getattr(spend, f"{name}_usd")
        projected = job.projected_usd or 0.0
        if already + projected <= limit and already < limit:
            return None
        left = max(0.0, limit - already)
        return Violation(f"max_usd_per_{name}", f"the project spent ${already:.2f} this "
                         f"{name} (UTC); with this job's projected ${projected:.2f} that passes "
                         f"policy max_usd_per_{name} ${limit:.2f}: "
                         + (f"{_affordable(left, job)}" if left > 0 else f"wait for the next {name}"))
    rule.__name__ = f"_max_per_{name}"
    return rule


def _affordable(usd: float, job: Job) -> str:
    if job.hourly_usd <= 0:
        return f"keep the job under ${usd:.2f}"
    return (f"ask for at most {usd / job.hourly_usd:.3g} h at this price "
            f"(--max-hours), or a cheaper instance")


RULES: tuple[Rule, ...] = (_allowed_instances, _max_gpus, _max_hours, _max_hourly, _max_parallel,
                           _require_spot, _max_per_job, _window("day"), _window("month"))


def check_job(policy: PolicySettings, job: Job, spend: Spend = Spend(),
              catalog: Catalog | None = None) -> list[Violation]:
    """Every rule the job breaks (empty: it complies)."""
    return [v for rule in RULES if (v := rule(policy, job, spend, catalog)) is not None]


def load_policy(settings: ProjectSettings) -> PolicySettings:
    """The policy file named by ``cost.policy_file`` if any, else the ``policy:`` section."""
    path = settings.cost.policy_file
    if not path:
        return settings.policy
    from prudent.wiring.config import read_yaml_file  # config imports this package's settings

    data = read_yaml_file(path, "policy file") or {}
    if isinstance(data, dict) and set(data) == {"policy"}:
        data = data["policy"]  # a prudent.yaml-style file with only the policy section
    try:
        return PolicySettings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None


def _describe(exc: ValidationError, path: str) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(map(str, err["loc"])) or "(top level)"
        if err["type"] == "extra_forbidden":
            parts.append(f"{path}: unknown policy key {key!r}; allowed: "
                         + ", ".join(PolicySettings.model_fields))
        else:
            reason = str(err["msg"]).removeprefix("Value error, ")
            parts.append(f"{path}: {key}={err.get('input')!r} is invalid: {reason}")
    return "; ".join(parts)


def job_from_settings(cost: CostSettings, catalog: Catalog, kind: str = "run",
                      parallel: int = 1) -> Job:
    """The job a run's ``cost:`` settings describe (an unknown instance is a ConfigError, and
    so is spot on a type the catalog has no spot price for: prudent never invents one)."""
    instance = catalog.lookup(cost.instance) if cost.instance else None
    if cost.spot and instance is not None and instance.spot_note and cost.hourly_usd is None:
        raise ConfigError(f"--spot on {instance.ref}: {instance.spot_note}; run it on demand "
                          f"(drop --spot / cost.spot) or pick a type with a spot price "
                          f"(`prudent catalog --cloud {instance.cloud}`)")
    return Job(kind=kind, instance=instance,
               spot=cost.spot, nodes=cost.nodes, parallel=parallel,
               hours=parse_hours(cost.max_hours) if cost.max_hours is not None else None,
               budget_usd=parse_usd(cost.budget_usd) if cost.budget_usd is not None else None,
               node_hourly_usd=parse_usd(cost.hourly_usd) if cost.hourly_usd is not None else None)


def project_spend(store: Store | None, exclude: str | None = None,
                  now: float | None = None) -> Spend:
    """Stored cost of the runs started this UTC day and month (``exclude``: one run id)."""
    if store is None:
        return Spend()
    now = time.time() if now is None else now
    today = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0,
                                                              microsecond=0)
    month = today.replace(day=1).timestamp()
    runs = [r for r in store.list_runs() if r["id"] != exclude and r["started_at"] >= month]
    day = sum(r["cost_usd"] or 0.0 for r in runs if r["started_at"] >= today.timestamp())
    return Spend(day_usd=day, month_usd=sum(r["cost_usd"] or 0.0 for r in runs))
