"""CostMeter: the component that knows what the run has cost so far, and stops it in budget.

Dollars = wall time x price per node-hour (spot price on spot) x nodes, summed over every
attempt of the run id (nodes: ``cost.nodes`` when set, else torchrun's count, see
:mod:`prudent.cost.shape`): a crashed or preempted attempt was billed too, so a relaunch adds to
the stored ``cost_usd`` instead of starting again at zero. On a new machine the attempts of
the others come with the run's record (``prudent.record``), imported before this meter starts,
so budgets and policy limits count every machine's spend. The training thread only reads the
clock and compares it with a precomputed deadline (see :mod:`prudent.cost.budget`); the store
is updated from a background thread every ``update_interval_s`` and once more at the end.
No instance known (a laptop): the meter still times the run, at $0.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from prudent.cost.budget import Limit, limits, stop_message
from prudent.cost.catalog import load_catalog
from prudent.cost.detect import with_detected
from prudent.cost.policy import (
    Job,
    Spend,
    check_job,
    job_from_settings,
    load_policy,
    project_spend,
)
from prudent.cost.settings import CostSettings, PolicySettings
from prudent.cost.shape import with_torchrun
from prudent.kernel.events import Component, Event, EventKind
from prudent.kernel.stop import StopKind, StopReason
from prudent.kernel.units import parse_duration_s
from prudent.record.attempt import attempt_id, host_name

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["CostMeter"]

log = logging.getLogger("prudent.cost")
_NO_DEADLINE = math.inf


class CostMeter(Component):
    name = "cost"
    main_rank_only = True  # rank 0 meters all nodes; the stop reaches every rank

    def __init__(self, settings: CostSettings | None = None, *, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None,
                 environ: Mapping[str, str] | None = None,
                 on_gpu: Callable[[], bool] | None = None) -> None:
        """``environ`` (default ``os.environ``) holds torchrun's job size; ``on_gpu`` says
        whether the job runs on GPUs (default: whether this process can use CUDA)."""
        self.settings = settings or CostSettings()
        self.quiet = quiet
        self.clock = clock
        self.stream = stream or sys.stderr
        self.environ = os.environ if environ is None else environ
        self.on_gpu = on_gpu or _can_use_cuda
        self.job = Job()
        self.shape: dict[str, Any] = {}  # what torchrun told: nodes, processes
        self.limits: list[Limit] = []
        self.prior_usd = 0.0
        self.prior_s = 0.0
        self.attempts = 1
        self.history: list[dict[str, Any]] = []  # earlier attempts, on any machine
        self._attempt_id: str | None = None
        self._t0: float | None = None
        self._deadline = math.inf
        self._last_check = 0.0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # numbers ------------------------------------------------------------------------------
    @property
    def hourly_usd(self) -> float:
        return self.job.hourly_usd

    def attempt_s(self) -> float:
        return 0.0 if self._t0 is None else self.clock() - self._t0

    def total_usd(self) -> float:
        """Dollars over every attempt of this run id, up to now."""
        return self.prior_usd + self.hourly_usd * self.attempt_s() / 3600

    # events -------------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        catalog = load_catalog(self.settings)
        self.settings, detected = with_detected(self.settings, run.settings.preemption, catalog)
        if detected:
            run.record_event(EventKind.COST, "detect", detected)
        self.job = job_from_settings(self.settings, catalog)  # unknown instance: ConfigError
        self.job, self.shape = with_torchrun(self.job, self.settings, self.environ, self.on_gpu)
        from prudent.cost.freshness import pricing
        policy = load_policy(run.settings)
        self._arm(run, policy)
        source = pricing(self.job, self.settings.stale_after_days)  # what priced it, how old
        run.record_event(EventKind.COST, "price", self._price_text(), **self._price(),
                         attempt=attempt_id(run.id), host=host_name(), **source)
        if source["stale"]:
            self._say(run, "warning: " + source["stale"])
        self._attempt_id = attempt_id(run.id)
        self._publish(run)
        if self.hourly_usd > 0:
            self._say(run, self._price_text() + self._first_limit_text())
        if self._deadline <= self._t0:  # spent already (a rerun without a raised budget)
            self._limit_reached(run)
        broken = check_job(policy, replace(self.job, hours=None, budget_usd=None),
                           Spend(), catalog)  # money and time are enforced by the deadline
        if broken:
            run.request_stop(StopReason(StopKind.POLICY, None,
                                        "; ".join(v.message for v in broken)))
        # without a limit to keep, no step needs timing: not called at all (a microsecond a step)
        run.subscribe(self, Event.STEP_END, self._deadline != _NO_DEADLINE)
        if self.hourly_usd > 0:
            run.gauges["cost_usd"] = self.total_usd()  # the console shows it live
            if run.store is not None:
                self._start_updates(run)

    def _publish(self, run: RunContext) -> None:
        """What the record's heartbeat needs to bill this attempt to the second."""
        run.gauges["cost_hourly_usd"] = self.hourly_usd
        run.gauges["cost_prior_usd"] = self.prior_usd
        run.gauges["cost_started_at"] = time.time() - self.attempt_s()

    def _start_updates(self, run: RunContext) -> None:
        self._thread = threading.Thread(target=self._update_store, args=(run,), daemon=True,
                                        name="prudent-cost-meter")
        self._thread.start()

    def _arm(self, run: RunContext, policy: PolicySettings) -> None:
        """Earlier attempts, the limits, and the deadline of the soonest one."""
        self.history = _prior_attempts(run)
        self.prior_usd = _prior_usd(run)
        self.prior_s = sum(a["seconds"] for a in self.history)
        self.attempts = len(self.history) + 1
        spend = project_spend(run.store, exclude=run.id) if run.store is not None else Spend()
        self.limits = limits(self.settings, policy, self.hourly_usd, self.prior_usd, self.prior_s,
                             spend, run.id)
        self._t0 = self.clock()
        self._last_check = math.inf  # the first step's time includes the script's setup
        margin_s = parse_duration_s(self.settings.stop_margin)
        first = self.limits[0].seconds_left - margin_s if self.limits else math.inf
        self._deadline = self._t0 + first

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        if self._deadline == _NO_DEADLINE:
            return  # no limit to keep (or the run is stopping): nothing to time
        now = self.clock()
        step_s, self._last_check = max(0.0, now - self._last_check), now
        if now + 2 * step_s >= self._deadline:  # the next steps would run past the limit
            self._limit_reached(run)

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        if self.clock() >= self._deadline:
            self._limit_reached(run)

    def on_epoch_end(self, run: RunContext, epoch: int) -> None:
        self.on_log(run, {})

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        if self._t0 is None:
            return  # on_start failed: nothing was metered
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        breakdown = self.breakdown()
        run.gauges["cost_final_usd"] = breakdown["total_usd"]  # what the record's end reports
        run.record_event(EventKind.COST, "meter", self._summary_text(breakdown), **breakdown,
                         **_progress(run))
        if run.store is not None:  # from the writer's thread, before the run's end; the cost
            store, total = run.store, breakdown["total_usd"]  # event is in the record too
            run.writer.call_soon(lambda: store.update_run(run.id, cost_usd=total))
        if self.hourly_usd > 0:
            self._say(run, self._summary_text(breakdown))

    def state_dict(self) -> dict[str, Any]:
        # Informational only: the store, not the checkpoint, holds the truth about money spent
        # (attempts after the newest checkpoint were billed too).
        return {"total_usd": self.total_usd(), "attempts": self.attempts}

    # internals ----------------------------------------------------------------------------
    def breakdown(self) -> dict[str, Any]:
        """What ``prudent show --json`` reports as ``cost``."""
        attempt_s, hourly = self.attempt_s(), self.hourly_usd
        total = self.prior_usd + hourly * attempt_s / 3600
        on_demand_hourly = replace(self.job, spot=False).hourly_usd
        on_demand = total * on_demand_hourly / hourly if hourly > 0 else 0.0
        return {**self._price(), "attempt_s": round(attempt_s, 3),
                "attempt_usd": round(hourly * attempt_s / 3600, 6),
                "prior_usd": round(self.prior_usd, 6), "attempts": self.attempts,
                "total_s": round(self.prior_s + attempt_s, 3), "total_usd": round(total, 6),
                "on_demand_usd": round(on_demand, 6), "saved_usd": round(on_demand - total, 6),
                "limits": [{"reason": lim.reason, "key": lim.key, "amount": lim.amount}
                           for lim in self.limits],
                "by_attempt": [*self.history, self._this_attempt(attempt_s)]}

    def _this_attempt(self, attempt_s: float) -> dict[str, Any]:
        instance = self.job.instance
        return {"attempt": self._attempt_id, "host": host_name(),
                "instance": instance.ref if instance else None, "hourly_usd": self.hourly_usd,
                "seconds": round(attempt_s, 3),
                "usd": round(self.hourly_usd * attempt_s / 3600, 6)}

    def _price(self) -> dict[str, Any]:
        instance = self.job.instance
        return {"instance": instance.ref if instance else None, "spot": self.job.spot,
                "nodes": self.job.nodes, "gpus": self.job.num_gpus,
                "hourly_usd": self.hourly_usd,
                "on_demand_hourly_usd": replace(self.job, spot=False).hourly_usd,
                "prices_as_of": instance.prices_as_of if instance else None, **self.shape}

    def _price_text(self) -> str:
        shape = f"; {self.shape['shape']}" if self.shape else ""
        if self.job.instance is None and self.job.node_hourly_usd is None:
            return f"no instance given (cost.instance, --instance): metered at $0{shape}"
        prior = f", ${self.prior_usd:.2f} spent before" if self.prior_usd else ""
        return f"metered at {self.job.describe()}{prior}{shape}"

    def _first_limit_text(self) -> str:
        if not self.limits or math.isinf(self.limits[0].seconds_left):
            return ""
        limit = self.limits[0]
        return f"; {limit.key} {limit.amount} stops it in {max(0.0, limit.seconds_left) / 60:.1f} min"

    def _summary_text(self, b: dict[str, Any]) -> str:
        saved = f", saved ${b['saved_usd']:.2f} on spot" if b["saved_usd"] > 0.005 else ""
        return (f"cost ${b['total_usd']:.2f} in all ({b['attempts']} attempt"
                f"{'s' * (b['attempts'] != 1)}; this one ${b['attempt_usd']:.2f} for "
                f"{b['attempt_s'] / 60:.1f} min at ${self.hourly_usd:.2f}/h){saved}")

    def _limit_reached(self, run: RunContext) -> None:
        self._deadline = math.inf  # once: the run is stopping
        limit = self.limits[0]
        total_s = self.prior_s + self.attempt_s()
        message = stop_message(limit, self.total_usd(), total_s, self.hourly_usd, self.attempts)
        run.record_event(EventKind.COST, "limit", message, reason=limit.reason, key=limit.key,
                         total_usd=self.total_usd(), total_s=total_s)
        self._say(run, message)
        run.request_stop(StopReason(StopKind(limit.reason), None, message))

    def _say(self, run: RunContext, text: str) -> None:
        if not self.quiet:
            print(f"prudent | {run.id} | {text}", file=self.stream, flush=True)

    def _update_store(self, run: RunContext) -> None:
        failures = 0
        while not self._done.wait(self.settings.update_interval_s):
            total = run.gauges["cost_usd"] = self.total_usd()
            try:
                run.store.update_run(run.id, cost_usd=total)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the meter must never take training down
                failures += 1
                if failures == 1:
                    log.warning("prudent could not store the run's cost (%s); training goes on", exc)


def _can_use_cuda() -> bool:
    """Whether this process can use a GPU; asked of torch only when the script imported it
    (the meter never imports torch itself)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


def _progress(run: RunContext) -> dict[str, int | None]:
    """Steps done and planned (epochs x batches per epoch, when the loader has a length): the
    bill projects what a run stopped early would have cost to the end."""
    state = run.state
    planned = (state.num_epochs * state.batches_per_epoch
               if state.num_epochs and state.batches_per_epoch else None)
    return {"steps_done": state.step, "planned_steps": planned}


def _prior_usd(run: RunContext) -> float:
    """Dollars of this run id's earlier attempts: the stored ``cost_usd`` (updated while they
    ran, and raised to the imported record's total when another machine ran them)."""
    record = run.store.get_run(run.id) if run.store is not None else None
    return float((record or {}).get("cost_usd") or 0.0)


def _prior_attempts(run: RunContext) -> list[dict[str, Any]]:
    """This run id's earlier attempts (on this machine or imported with the record), each with
    its host, price, seconds and dollars.

    Seconds come from each attempt's final ``cost/meter`` event or, for an attempt killed
    before it could write one, from its last event of any kind (for a lost machine, the
    ``checkpoint/record_lost`` event at its last heartbeat).
    """
    if run.store is None:
        return []
    attempts: list[dict[str, Any]] = []
    for event in run.store.events(run.id):
        kind_name, payload = (event["kind"], event["name"]), event["payload"]
        if kind_name == ("cost", "price"):
            attempts.append({"attempt": payload.get("attempt"), "host": payload.get("host"),
                             "instance": payload.get("instance"),
                             "hourly_usd": float(payload.get("hourly_usd") or 0.0),
                             "start": event["wall"], "last": event["wall"], "known_s": None,
                             "known_usd": None})
        elif attempts:
            current = attempts[-1]
            current["last"] = event["wall"]
            if kind_name in (("cost", "meter"), ("checkpoint", "record_lost")):
                current["known_s"] = payload.get("attempt_s")
                current["known_usd"] = payload.get("attempt_usd")
    return [_settled(a) for a in attempts]


def _settled(attempt: dict[str, Any]) -> dict[str, Any]:
    start, last = attempt.pop("start"), attempt.pop("last")
    known_s, known_usd = attempt.pop("known_s"), attempt.pop("known_usd")
    seconds = float(known_s) if known_s is not None else last - start
    usd = float(known_usd) if known_usd is not None else attempt["hourly_usd"] * seconds / 3600
    return {**attempt, "seconds": round(seconds, 3), "usd": round(usd, 6)}
