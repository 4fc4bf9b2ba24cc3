"""One worker process of ``prudent tune``: pick a trial, run it as a supervised run, tell the result.

Workers share nothing but the study's storage (and, on one machine, a lock file that makes
"count, check the budget, ask" one step). A trial is a ``prudent run`` of the user's unchanged
command with a run id derived from the trial, so the trial, its run, its checkpoints and its
events stay linked. A trial whose worker died (the worker's pid and host are in the trial's
user attributes) is claimed by the next worker on that host and resumed from its checkpoint
under the same run id, keeping its number: no trial is lost or run twice. A trial whose whole
machine vanished stops beating; a worker on another machine fails it and resumes its run from
its checkpoint as Optuna's retry of it (:mod:`prudent.tune.machines`).

Run as ``python -m prudent.tune.worker`` with the job in its launch spec (``launch/spec.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prudent.kernel.errors import ConfigError, ExitCode
from prudent.kernel.events import EventKind
from prudent.kernel.stop import StopKind, StopReason
from prudent.launch.spec import ENV_TUNE_JOB, LaunchSpec, TrialSpec
from prudent.launch.supervisor import Supervisor
from prudent.tune.owners import created_at, owner_alive, pid_runs

__all__ = ["ENV_JOB", "FATAL_CODE", "TuneJob", "main"]

ENV_JOB = ENV_TUNE_JOB
FATAL_CODE = int(ExitCode.BAD_INPUT)  # a worker that found the study cannot go on
_INTERRUPTED = {int(ExitCode.PREEMPTED), int(ExitCode.INTERRUPTED), 128 + signal.SIGTERM}
_ORPHAN_WAIT_S = 60.0


@dataclass
class TuneJob:
    """Everything a worker needs, passed as JSON from the coordinator."""

    study: str
    storage: str
    home: str
    command: list[str]
    objective: str
    sampler: str
    pruner: dict[str, Any]
    workers: int = 1
    trials: int | None = None
    deadline: float | None = None  # time.time() after which no trial starts
    budget_usd: float | None = None
    trial_usd_estimate: float | None = None
    seed: int | None = None
    config_path: str | None = None
    max_restarts: int = 0
    fixed: dict[str, Any] = field(default_factory=dict)  # --set: the same in every trial
    max_steps: int | None = None  # a trial stops (complete) after this many optimizer steps
    threads: int | None = None  # OMP_NUM_THREADS of each trial (None: inherited)
    heartbeat_s: int | None = None  # a database storage's trial heartbeat (machines.py)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: str) -> TuneJob:
        return cls(**json.loads(raw))


@dataclass
class Task:
    number: int
    trial_id: int
    params: dict[str, Any]
    run_id: str
    resumed: bool = False


class FatalStudyError(ConfigError):
    """The study cannot go on (the objective is never logged, the script rejects the space)."""


class Worker:
    def __init__(self, job: TuneJob, index: int = 0) -> None:
        from prudent.record.attempt import host_name
        from prudent.store.database import Store
        from prudent.tune.machines import MachinesLock
        from prudent.tune.space import load_space
        from prudent.tune.strategy import make_pruner, make_sampler
        from prudent.tune.study import load, meta_of, open_storage
        from prudent.wiring.config import load_settings

        self.job, self.index = job, index
        self.settings = load_settings(job.config_path)
        seed = None if job.seed is None else job.seed + index
        # kept: trial ids, attributes and heartbeats go through it
        self.storage = open_storage(job.storage, job.heartbeat_s)
        self.machines = MachinesLock(job.storage, job.study)
        self.study = load(job.study, self.storage,
                          sampler=make_sampler(job.sampler, workers=job.workers, seed=seed),
                          pruner=make_pruner(job.pruner["name"], **job.pruner.get("args", {})))
        self.study_id = self.storage.get_study_id_from_name(self.study.study_name)
        self.meta = meta_of(self.study)
        self.space = load_space(self.meta["space"])
        self.store = Store.open(self.settings.store)
        tuner = os.getppid()
        self.me = {"host": host_name(), "pid": os.getpid(), "created": created_at(os.getpid()),
                   "tuner": {"pid": tuner, "created": created_at(tuner)}}
        self.stopping = False

    # the loop -----------------------------------------------------------------------------
    def run(self) -> int:
        from prudent.tune.study import study_lock

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        patience = time.monotonic() + _ORPHAN_WAIT_S * 2
        try:
            while not self.stopping:
                with study_lock(self.job.home, self.job.study), self.machines.held():
                    task = self._pick()
                if task is None:
                    if self._winding_down() and not self.stopping and time.monotonic() < patience:
                        time.sleep(0.5)  # a dead tuner's worker is still releasing a trial
                        continue
                    return 0
                if not self._run_task(task):
                    return 0
            return 0
        except FatalStudyError as exc:
            _halt(self.job, str(exc))
            print(f"prudent: error: {exc}", file=sys.stderr, flush=True)
            return FATAL_CODE
        finally:
            self.machines.close()
            self.store.close()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True

    # picking a trial ----------------------------------------------------------------------
    def _pick(self) -> Task | None:
        """Under the study's locks: fail the trials of lost machines (Optuna enqueues their
        retries), then resume an orphan of this machine, else ask (a retry pops first)."""
        from prudent.tune.machines import fail_stale

        fail_stale(self.study)
        task = self._claim_orphan() or self._ask()
        if task is not None:
            self._beat(task.trial_id)
        return task

    def _beat(self, trial_id: int) -> None:
        """The first heartbeat before the locks go: a trial just picked is never stale."""
        from prudent.tune.machines import heartbeat_s_of

        if heartbeat_s_of(self.storage):
            self.storage.record_heartbeat(trial_id)

    def _claim_orphan(self) -> Task | None:
        import optuna

        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            owner = trial.user_attrs.get("worker")
            if owner and (owner.get("host") != self.me["host"] or owner_alive(owner)):
                continue  # run by a live worker, or on another machine (it will resume it)
            if "run_id" not in trial.user_attrs:
                if owner:  # its worker died between ask and launch: it never ran
                    self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                continue  # else being asked right now by a worker on another machine
            trial_id = self._id_of(trial.number)
            self.storage.set_trial_user_attr(trial_id, "worker", self.me)
            return Task(trial.number, trial_id, dict(trial.params), trial.user_attrs["run_id"],
                        resumed=True)
        return None

    def _winding_down(self) -> bool:
        """A trial is still held by a live worker of a dead tuner on this host (its trial
        checkpoints after the tuner was killed): wait to resume it rather than leave it."""
        import optuna

        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            owner = trial.user_attrs.get("worker")
            if (owner and owner.get("host") == self.me["host"] and owner_alive(owner)
                    and not owner_alive(owner.get("tuner") or {})):
                return True
        return False

    def _ask(self) -> Task | None:
        reason = self._why_not_another()
        if reason:
            if reason != "done":
                print(f"prudent: tune: {reason}", file=sys.stderr, flush=True)
            return None
        from prudent.tune.machines import CARRIES_ATTR, quiet, retry_of

        with quiet():  # study.ask warns that heartbeats are meant for study.optimize
            trial = self.study.ask()
        params = self.space.suggest(trial)
        trial_id = self._id_of(trial.number)
        frozen = self.storage.get_trial(trial_id)
        lost = retry_of(frozen)
        run_id = frozen.user_attrs.get("run_id") if lost is not None else None
        trial.set_user_attr("worker", self.me)
        if run_id:  # the retry of a trial whose machine was lost: its run goes on
            print(f"prudent: tune: trial {lost} lost its machine "
                  f"({(frozen.user_attrs.get('worker') or {}).get('host', '?')}: no heartbeat); "
                  f"trial {trial.number} resumes its run {run_id} from its checkpoint",
                  file=sys.stderr, flush=True)
            return Task(trial.number, trial_id, params, run_id, resumed=True)
        run_id = f"{self.job.study}-{self.meta['token']}-t{trial.number:04d}"[-128:]
        trial.set_user_attr("run_id", run_id)
        trial.set_user_attr(CARRIES_ATTR, self._checkpoint_base() is not None)
        return Task(trial.number, trial_id, params, run_id)

    def _id_of(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def _why_not_another(self) -> str:
        from prudent.tune.budget import next_trial_fits

        if self.stopping or _halted(self.job):
            return "done"
        from prudent.tune.machines import chain_costs, counted

        every = self.study.get_trials(deepcopy=False)
        if self.job.trials is not None and len(counted(every)) >= self.job.trials:
            return "done"
        if self.job.deadline is not None and time.time() >= self.job.deadline:
            return "timeout reached: no new trial starts"
        runs = chain_costs(every, self._cost)  # every machine's trials, a retry chain once
        finished = [usd for usd, done in runs if done]
        running = [usd for usd, done in runs if not done]
        fits, why = next_trial_fits(self.job.budget_usd, finished, running,
                                    self.job.trial_usd_estimate)
        return "" if fits else why

    def _cost(self, trial: Any) -> float:
        """A finished trial's cost; a running one's spend so far: this machine's store, or
        what the trial's machine published with its heartbeat."""
        from prudent.tune.machines import SPENT_ATTR

        if "cost_usd" in trial.user_attrs:
            return float(trial.user_attrs["cost_usd"])
        published = float(trial.user_attrs.get(SPENT_ATTR) or 0.0)
        if trial.state.is_finished():  # lost with its machine: its run may go on in a retry
            return published
        return max(published, self._spent(trial))

    def _spent(self, trial: Any) -> float:
        run = self.store.get_run(trial.user_attrs.get("run_id", "")) if trial.user_attrs else None
        return float(run["cost_usd"] or 0.0) if run else 0.0

    def _checkpoint_base(self) -> str | None:
        return self.settings.checkpoint.url

    def _checkpoint_url(self, run_id: str) -> str | None:
        """Each trial's own checkpoint location under ``checkpoint.url`` (``{run_id}`` in it is
        replaced, else the run id is appended): one run's record never mixes with another's."""
        base = self._checkpoint_base()
        if base is None:
            return None
        if "{run_id}" in base:
            return base.replace("{run_id}", run_id)
        return f"{base.rstrip('/')}/{run_id}"

    # running it ---------------------------------------------------------------------------
    def _run_task(self, task: Task) -> bool:
        """Run (or resume, or just settle) a trial; False when this worker must stop."""
        from prudent.tune.machines import TrialHeartbeat

        with TrialHeartbeat(self.storage, task.trial_id, lambda: self._spent_of(task)):
            code = self._run_or_settle(task)
        return self._settle(task, code)

    def _spent_of(self, task: Task) -> float | None:
        run = self.store.get_run(task.run_id)
        return float(run["cost_usd"] or 0.0) if run else None

    def _run_or_settle(self, task: Task) -> int:
        code: int | None = None
        if task.resumed:
            record = self._wait_for_previous(task)
            if record is not None and _settled(record):
                code = record["exit_code"] if record["exit_code"] is not None else 0
            else:
                print(f"prudent: tune: trial {task.number} was interrupted; resuming run "
                      f"{task.run_id} from its checkpoint", file=sys.stderr, flush=True)
        if code is None:
            code = self._launch(task)
        return code

    def _launch(self, task: Task) -> int:
        if self.stopping:  # told to stop after this trial was picked: it stays resumable
            return int(ExitCode.INTERRUPTED)

        job = self.job
        trial = TrialSpec(storage=job.storage, study=job.study, trial_id=task.trial_id,
                          number=task.number, objective=job.objective, pruner=dict(job.pruner),
                          max_steps=job.max_steps)
        threads = {} if job.threads is None else {"OMP_NUM_THREADS": str(job.threads)}
        url = self._checkpoint_url(task.run_id)
        settings = {} if url is None else {("checkpoint", "url"): url}
        supervisor = Supervisor(
            job.command, self.settings, run_id=task.run_id,
            name=f"{job.study}-trial-{task.number}", overrides={**job.fixed, **task.params},
            config_path=job.config_path, max_restarts=job.max_restarts,
            spec=LaunchSpec(trial=trial, settings=settings), extra_env=threads)
        code = supervisor.run()
        if supervisor.signals_seen:
            self.stopping = True
        return code

    def _wait_for_previous(self, task: Task) -> dict[str, Any] | None:
        """The dead worker's training process gets SIGTERM and checkpoints: let it finish."""
        deadline = time.monotonic() + _ORPHAN_WAIT_S
        while True:
            record = self.store.get_run(task.run_id)
            pid = record.get("pid") if record else None
            if not (record and record["status"] == "running" and pid and pid_runs(pid, task.run_id)):
                return record
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)  # our own orphan, past its grace period
            time.sleep(0.2)

    def _settle(self, task: Task, code: int) -> bool:
        """Tell the study how the trial ended; False when this worker must stop."""
        from optuna.trial import TrialState

        record = self.store.get_run(task.run_id) or {}
        reason = record.get("stop_reason")
        if self.storage.get_trial(task.trial_id).state.is_finished():
            print(f"prudent: tune: trial {task.number} was failed by another machine while it "
                  "ran here (its heartbeat went silent); its retry continues run "
                  f"{task.run_id}", file=sys.stderr, flush=True)
            return not self.stopping
        if code in _INTERRUPTED or code < 0 or reason in ("preempted", "interrupted"):
            # left RUNNING on purpose: the next `prudent tune` resumes it from its checkpoint
            self.storage.set_trial_user_attr(task.trial_id, "worker", None)
            self.stopping = True
            return False
        attrs = self._outcome_attrs(task, record)
        unread = _unread_config(self.store, task.run_id)
        if unread:
            attrs["error"] = unread
        for key, value in attrs.items():
            self.storage.set_trial_user_attr(task.trial_id, key, value)
        if unread:  # trained on the script's own values, not the trial's: never scored
            self.study.tell(task.number, state=TrialState.FAIL)
        elif code == ExitCode.COMPLETED or self._spent_step_budget(code, record):
            value = self._objective(task, record)
            self.study.tell(task.number, value, state=TrialState.COMPLETE)
        elif code in (ExitCode.PRUNED, ExitCode.RULE):
            self.study.tell(task.number, state=TrialState.PRUNED)
        else:
            self.study.tell(task.number, state=TrialState.FAIL)
            if code == ExitCode.BAD_INPUT:
                self.storage.set_trial_user_attr(task.trial_id, "fatal", True)
                raise FatalStudyError(
                    f"trial {task.number} (run {task.run_id}) exited with code 2: the script "
                    f"rejected its configuration {task.params} (see its error above); fix the "
                    "space or the script's config keys, then run the same command again")
        return not self.stopping

    def _spent_step_budget(self, code: int, record: Mapping[str, Any]) -> bool:
        """The trial stopped on its --max-steps budget: a complete trial, not a failed one.

        Read from the record's typed facts (budget stop, steps done), not from a message; a
        cost budget hit at the same step would read the same, and the trial did run its steps.
        """
        return (self.job.max_steps is not None and code == ExitCode.BUDGET
                and record.get("stop_reason") == StopKind.BUDGET.value
                and int(record.get("step") or 0) >= self.job.max_steps)

    def _outcome_attrs(self, task: Task, record: Mapping[str, Any]) -> dict[str, Any]:
        attrs: dict[str, Any] = {"cost_usd": float(record.get("cost_usd") or 0.0),
                                 "epochs": _epochs(self.storage, task, record),
                                 "steps": int(record.get("step") or 0)}
        reason = record.get("stop_reason")
        stop = StopReason.parse(reason) if reason else None
        if stop is not None and stop.kind is StopKind.BUDGET and self.job.max_steps:
            attrs["step_budget"] = self.job.max_steps
        if stop is not None and record.get("status") == "completed":
            attrs["stopped_early"] = str(stop)  # early stopping: done, its best value scored
        elif stop is not None and stop.ends_early:
            attrs["pruned_by"] = _pruned_by(self.store, task.run_id, stop)
        elif record.get("status") == "failed":
            attrs["error"] = _last_end_message(self.store, task.run_id)
        return attrs

    def _objective(self, task: Task, record: Mapping[str, Any]) -> float:
        series = [v for _, v in self.store.metric_series(task.run_id, self.job.objective)]
        if series and series[-1] is not None:
            if record.get("status") == "completed" and record.get("stop_reason"):
                # stopped early, the best evaluation's weights put back: that is the trial's
                import optuna

                seen = [v for v in series if v is not None and v == v]
                best = max if self.study.direction == optuna.study.StudyDirection.MAXIMIZE else min
                return float(best(seen))
            return float(series[-1])
        # the names the script logged, not the profiler's machine series (profile/cpu_pct, ...)
        logged = sorted(n for n in self.store.last_metrics(task.run_id)
                        if not n.startswith("profile/"))
        self.storage.set_trial_user_attr(task.trial_id, "fatal", True)
        self.study.tell(task.number, state=__import__("optuna").trial.TrialState.FAIL)
        if series:
            raise FatalStudyError(f"trial {task.number} completed but its objective "
                                  f"{self.job.objective!r} is not finite (NaN); the study stops")
        raise FatalStudyError(
            f"--objective {self.job.objective!r} was never logged by trial {task.number} (run "
            f"{task.run_id}); it logged: {', '.join(logged) or 'nothing'}. Log it with "
            f"run.log({self.job.objective}=...) after each evaluation, or pick one of those "
            "names with --objective")


# helpers ----------------------------------------------------------------------------------
def _epochs(storage: Any, task: Task, record: Mapping[str, Any]) -> int:
    """Epochs done: the record's, or the last epoch reported (a trial reporting at steps has
    no epochs but the record's, 0 in a loop without ``run.epochs``)."""
    from prudent.tune.trial import UNIT_ATTR

    trial = storage.get_trial(task.trial_id)
    reported = [] if trial.user_attrs.get(UNIT_ATTR) == "step" else trial.intermediate_values
    return max([int(record.get("epoch") or 0), *map(int, reported)])


def _pruned_by(store: Any, run_id: str, stop: StopReason) -> str:
    """``pruner`` or ``rule:<name>``: the rule the stop request names in its payload."""
    if stop.kind is StopKind.RULE:
        return str(stop)
    for event in reversed(store.events(run_id)):
        if (event["kind"], event["name"]) == (EventKind.LIFECYCLE.value, "stop_requested"):
            rule = event["payload"].get("rule")
            return f"rule:{rule}" if rule else "pruner"
    return "pruner"


def _unread_config(store: Any, run_id: str) -> str | None:
    """The message of the trial's ``config/unread`` event: a value of the trial that the
    script did not read (see ``watches/unread_config.py``); None when it read them all."""
    for event in store.events(run_id):
        if (event["kind"], event["name"]) == (EventKind.CONFIG.value, "unread"):
            return str(event["message"])[:500]
    return None


def _last_end_message(store: Any, run_id: str) -> str:
    for event in reversed(store.events(run_id)):
        if event["name"] == "end":
            return str(event["message"])[:500]
    return ""


def _settled(record: Mapping[str, Any]) -> bool:
    """The run ended on its own (completed, pruned, failed) before its worker could tell."""
    if record["status"] == "completed":
        return True
    return record["status"] in ("stopped", "failed") and record["stop_reason"] not in (
        "preempted", "interrupted") and record["exit_code"] is not None and record[
        "exit_code"] >= 0 and record["exit_code"] not in _INTERRUPTED


def _halt_file(job: TuneJob) -> Path:
    return Path(job.home).resolve() / "studies" / job.study / "halt"


def _halt(job: TuneJob, message: str) -> None:
    _halt_file(job).write_text(message + "\n")


def _halted(job: TuneJob) -> bool:
    return _halt_file(job).exists()


def main() -> None:
    try:
        spec = LaunchSpec.from_env()
        if spec.tune_job is None:
            print(f"prudent: error: {ENV_JOB} is not set: workers are started by prudent tune",
                  file=sys.stderr)
            sys.exit(FATAL_CODE)
        code = Worker(TuneJob(**spec.tune_job), spec.tune_worker or 0).run()
    except ConfigError as exc:
        print(f"prudent: error: {exc}", file=sys.stderr)
        code = FATAL_CODE
    sys.exit(code)


if __name__ == "__main__":
    main()
