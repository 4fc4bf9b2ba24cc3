"""``prudent tune``: open (or continue) the study, project its cost, start the workers, report.

The coordinator does no training itself: it validates everything before a trial starts (space,
storage, objective/direction against an existing study, policy), prints the projection, starts
``workers`` worker processes (``prudent.tune.worker``), forwards SIGINT/SIGTERM/SIGHUP to them
(their trials checkpoint and stay resumable), and prints the results when they are done.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prudent.kernel.errors import ConfigError
from prudent.launch.spawn import SignalForwarder, spawn
from prudent.launch.spec import LaunchSpec
from prudent.tune.space import SearchSpace, load_space
from prudent.tune.strategy import DEFAULT_PRUNER, DEFAULT_SAMPLER, PRUNERS, SAMPLERS
from prudent.wiring.config import ProjectSettings

__all__ = ["TuneOptions", "Tuner", "parse_enqueue"]


@dataclass
class TuneOptions:
    """What ``prudent tune`` was asked for (the CLI's flags, ``prudent.tune``'s arguments)."""

    command: list[str]
    space: str | Mapping[str, Any]
    objective: str
    direction: str = "max"
    trials: int | None = 20
    workers: int = 1
    timeout_s: float | None = None
    budget_usd: float | None = None
    sampler: str = DEFAULT_SAMPLER
    pruner: str = DEFAULT_PRUNER
    study: str | None = None
    storage: str | None = None
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    max_epochs: int | None = None
    epoch_s: float | None = None
    seed: int | None = None
    config_path: str | None = None
    max_restarts: int = 0
    warm_start: str | None = None  # an earlier study whose best configurations go first
    fixed: dict[str, Any] = field(default_factory=dict)  # --set: the same in every trial
    max_steps: int | None = None  # each trial stops (complete) after this many optimizer steps
    min_resource: int | None = None  # the pruner's first rung (epochs or steps)
    heartbeat_s: int | None = None  # a database storage's trial heartbeat (None: the default)

    def validate(self) -> SearchSpace:
        if not self.command:
            raise ConfigError("no command to tune: write it after '--', e.g. prudent tune "
                              "--space space.yaml --objective val_acc -- python train.py")
        if self.direction not in ("max", "min"):
            raise ConfigError(f"--direction must be max or min, got {self.direction!r}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"--sampler {self.sampler!r}: choose one of {', '.join(SAMPLERS)}")
        if self.pruner not in PRUNERS:
            raise ConfigError(f"--pruner {self.pruner!r}: choose one of {', '.join(PRUNERS)}")
        for flag, value in (("--trials", self.trials), ("--workers", self.workers),
                            ("--max-epochs", self.max_epochs), ("--max-steps", self.max_steps),
                            ("--min-resource", self.min_resource),
                            ("--heartbeat", self.heartbeat_s)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} must be >= 1, got {value}")
        for flag, number in (("--timeout", self.timeout_s), ("--budget-usd", self.budget_usd),
                             ("--epoch-s", self.epoch_s)):
            if number is not None and number <= 0:
                raise ConfigError(f"{flag} must be > 0, got {number}")
        if not self.objective:
            raise ConfigError("--objective is required: the name your script logs with "
                              "run.log(NAME=value), e.g. --objective val_acc")
        space = load_space(self.space)
        for i, config in enumerate(self.enqueue):
            space.check_config(config, f"--enqueue #{i + 1}")
        _check_fixed(self.fixed, space, self.space)
        return space

    def pruner_spec(self) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.pruner == "hyperband" and self.max_resource:
            args["max_resource"] = self.max_resource
        if self.min_resource is not None and self.pruner != "none":
            args["min_resource"] = self.min_resource
        return {"name": self.pruner, "args": args}

    @property
    def across_machines(self) -> bool:
        """A database storage: the study may be shared by several machines' tuners."""
        return bool(self.storage) and "://" in str(self.storage) and not str(
            self.storage).startswith(("journal://", "sqlite:"))

    @property
    def max_resource(self) -> int | None:
        """A full trial's length in what trials report: epochs, else --max-steps' steps."""
        return self.max_epochs or self.max_steps

    @property
    def unit(self) -> str:
        """What the projection counts: steps when only --max-steps says how long a trial is."""
        return "step" if self.max_steps and not self.max_epochs else "epoch"


def _check_fixed(fixed: Mapping[str, Any], space: SearchSpace,
                 source: str | Mapping[str, Any]) -> None:
    """A --set key the space also samples is a contradiction, not a silent override."""
    sampled = {p.name for p in space.params}
    for key, value in fixed.items():
        if key in sampled:
            where = f"search space {source}" if isinstance(source, str) else "search space"
            raise ConfigError(
                f"--set {key}={value!r} fixes {key!r}, which the {where} also searches: keep "
                f"{key!r} in one of them (--set to fix it, the space to search it)")


class Tuner:
    """Runs a study. ``spec`` adds to what each worker (and so each trial) is told, e.g. the
    cost settings given on the command line."""

    def __init__(self, options: TuneOptions, settings: ProjectSettings, *, quiet: bool = False,
                 spec: LaunchSpec | None = None) -> None:
        from prudent.tune.study import validate_study_name

        self.options = options
        self.settings = settings
        self.space = options.validate()
        self.name = validate_study_name(options.study or _guess_name(options.command))
        self.home = str(Path(settings.store.home).resolve())
        self.quiet = quiet
        self.spec = spec or LaunchSpec()
        self.forwarder = SignalForwarder()

    # the whole of `prudent tune` ---------------------------------------------------------
    def run(self) -> int:
        from prudent.tune.report import print_summary, summarize, write_plots

        study, storage = self.open()
        projection = self._projection(study)
        self._say(f"study {self.name!r} in {storage}: {_progress(study)}")
        for line in projection.lines():
            self._say(line)
        _clear_halt(self.home, self.name)
        self._say_machines()
        code = self._work(storage, projection)
        summary = summarize(study, self.settings)
        summary["plots"] = write_plots(study, Path(self.home) / "studies" / self.name)
        if not self.quiet:
            print_summary(summary)
        if code == 130 and summary["counts"].get("running"):
            self._say(f"interrupted: {summary['counts']['running']} running trial(s) left to "
                      "resume; run the same command again to continue the study")
        self.summary = summary
        return code

    def open(self) -> tuple[Any, str]:
        """Create or continue the study, enqueue the known-good configurations (once)."""
        from prudent.tune.study import storage_url

        url = storage_url(self.home, self.name, self.options.storage)
        meta = {"objective": self.options.objective, "direction": self.options.direction,
                "space": self.space.as_dict(), "pruner": self.options.pruner_spec(),
                "sampler": self.options.sampler, "command": self.options.command,
                "max_epochs": self.options.max_epochs, "max_steps": self.options.max_steps,
                "fixed": self.options.fixed}
        study = _create_or_load(self.name, url, meta)
        configs = list(self.options.enqueue)
        if self.options.warm_start:
            configs += self._warm_start(self.options.warm_start)
        for config in configs:
            study.enqueue_trial(config, skip_if_exists=True)
        return study, url

    def _warm_start(self, name: str, best: int = 5) -> list[dict[str, Any]]:
        """The best configurations of an earlier study, as far as they fit this space."""
        from prudent.tune.study import (
            load,
            open_storage,
            storage_url,
            validate_study_name,
        )

        url = storage_url(self.home, validate_study_name(name), self.options.storage)
        if self.options.storage is None and not Path(url).exists():
            raise ConfigError(f"--warm-start {name!r}: no such study ({url} does not exist)")
        earlier = load(name, open_storage(url))
        done = [t for t in earlier.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
        done.sort(key=lambda t: t.value, reverse=earlier.direction.name == "MAXIMIZE")
        configs = [c for c in (self.space.fitting(t.params) for t in done[:best]) if c]
        self._say(f"warm start: {len(configs)} configuration(s) from study {name!r} go first")
        return configs

    def _say_machines(self) -> None:
        """Across machines, a lost machine's trial resumes elsewhere only from shared storage."""
        from prudent.tune.machines import DEFAULT_HEARTBEAT_S, GRACE_HEARTBEATS

        if not self.options.across_machines:
            return
        beat = self.options.heartbeat_s or DEFAULT_HEARTBEAT_S
        url = self.settings.checkpoint.url
        where = (f"each trial checkpoints under {url.rstrip('/')}/<run id>" if url and
                 "{run_id}" not in url else f"each trial checkpoints at {url}" if url else
                 "trials checkpoint on this machine's disk (checkpoint.url is not set): a "
                 "trial whose machine is lost restarts from scratch elsewhere and the money it "
                 "spent there is not carried; set checkpoint.url (or PRUDENT_CHECKPOINT_URL) "
                 "to storage every machine reaches, e.g. s3://bucket/tune")
        self._say(f"across machines: a trial silent for {beat * GRACE_HEARTBEATS} s "
                  f"({GRACE_HEARTBEATS} heartbeats of {beat} s) has lost its machine and is "
                  f"resumed by another; {where}")

    # workers ----------------------------------------------------------------------------
    def _work(self, storage: str, projection: Any) -> int:
        from prudent.tune.worker import FATAL_CODE, TuneJob

        o = self.options
        job = TuneJob(study=self.name, storage=storage, home=self.home, command=o.command,
                      objective=o.objective, sampler=o.sampler, pruner=o.pruner_spec(),
                      workers=o.workers, trials=o.trials, budget_usd=o.budget_usd,
                      deadline=time.time() + o.timeout_s if o.timeout_s else None,
                      trial_usd_estimate=projection.trial_usd, seed=o.seed,
                      config_path=o.config_path, max_restarts=o.max_restarts,
                      fixed=dict(o.fixed), max_steps=o.max_steps, threads=self._threads(),
                      heartbeat_s=self._heartbeat_s())
        with self.forwarder:
            for index in range(o.workers):
                # own session: a terminal's Ctrl-C reaches a worker once, through the forwarder
                self.forwarder.add(spawn([sys.executable, "-m", "prudent.tune.worker"],
                                         replace(self.spec, tune_job=job.as_dict(),
                                                 tune_worker=index)))
            codes = self._wait_all(FATAL_CODE)
        if FATAL_CODE in codes:
            return FATAL_CODE
        if self.forwarder.signals_seen:
            return 130
        return 0 if all(c == 0 for c in codes) else 1

    def _heartbeat_s(self) -> int | None:
        from prudent.tune.machines import DEFAULT_HEARTBEAT_S

        if not self.options.across_machines:
            return None  # a journal file or SQLite: one machine, its orphans found by pid
        return self.options.heartbeat_s or DEFAULT_HEARTBEAT_S

    def _threads(self, environ: Mapping[str, str] | None = None) -> int | None:
        """Threads per trial so that workers x threads fit the cores (None: the user's
        OMP_NUM_THREADS stands). Torch's default, one per core in every trial, makes two
        workers on two cores several times slower than one."""
        import os

        env = os.environ if environ is None else environ
        if env.get("OMP_NUM_THREADS"):
            return None
        cores = _cores()
        threads = max(1, cores // self.options.workers)
        self._say(f"each trial runs with OMP_NUM_THREADS={threads} ({cores} cores / "
                  f"{self.options.workers} worker(s)); set OMP_NUM_THREADS to choose")
        return threads

    def _wait_all(self, fatal: int) -> list[int]:
        """Wait for every worker; one that finds the study broken stops the others."""
        workers = self.forwarder.children
        stopped_others = False
        while True:
            codes = [w.poll() for w in workers]
            if all(c is not None for c in codes):
                return [int(c) for c in codes]  # type: ignore[arg-type]
            if fatal in codes and not stopped_others:
                stopped_others = True
                for worker in workers:
                    if worker.poll() is None:
                        worker.send_signal(signal.SIGTERM)
            time.sleep(0.1)

    # projection -------------------------------------------------------------------------
    def _projection(self, study: Any) -> Any:
        from prudent.tune.budget import project
        from prudent.tune.report import reported_unit

        unit = self.options.unit if self.options.max_resource else reported_unit(study)
        measured_max, measured_s = _measured(study, self.settings, unit)
        max_resource = self.options.max_resource or measured_max
        if self.options.epoch_s and unit == "epoch":
            epoch_s, source = self.options.epoch_s, "given by --epoch-s"
        elif measured_s:
            epoch_s, source = measured_s, "measured on this study's trials"
        else:
            epoch_s, source = None, ""
        hourly, price_source = self._price()
        remaining = (self.options.trials or 0) - _counted(study)
        return project(trials=max(0, remaining), pruner=self.options.pruner_spec(),
                       max_epochs=max_resource, epoch_s=epoch_s, epoch_s_source=source,
                       hourly_usd=hourly, price_source=price_source, workers=self.options.workers,
                       unit=unit)

    def _price(self) -> tuple[float, str]:
        from prudent.cost.launch import check_launch

        job = check_launch(self.settings, kind="tune", parallel=self.options.workers)
        hourly = job.hourly_usd / max(1, job.parallel)
        if job.node_hourly_usd is None and job.instance is None:
            return 0.0, "no instance given: --instance or cost.instance prices it"
        return hourly, job.describe().split(" (", 1)[-1].rstrip(")")

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(f"prudent: tune: {text}", file=sys.stderr, flush=True)


def parse_enqueue(items: Sequence[str]) -> list[dict[str, Any]]:
    """``--enqueue`` values: inline JSON/YAML mappings (or lists of them), or files holding them."""
    import yaml

    configs: list[dict[str, Any]] = []
    for item in items:
        path = Path(item)
        try:
            text = path.read_text() if path.is_file() else item
            data = yaml.safe_load(text)
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--enqueue {item!r}: not a readable file nor JSON ({exc})") from None
        data = data if isinstance(data, list) else [data]
        for config in data:
            if not isinstance(config, dict):
                raise ConfigError(f"--enqueue {item!r}: expected a mapping like "
                                  f'{{"lr": 0.01}}, got {config!r}')
            configs.append(config)
    return configs


def _create_or_load(name: str, url: str, meta: Mapping[str, Any]) -> Any:
    """The study, created by one machine only when several start at once on a database."""
    import sqlalchemy as sa

    from prudent.store.database import describe_error, mask_url
    from prudent.tune.machines import MachinesLock
    from prudent.tune.study import create_or_load, open_storage

    lock = MachinesLock(url, None)
    try:
        with lock.held():
            return create_or_load(name, open_storage(url), meta)
    except sa.exc.OperationalError as exc:
        raise ConfigError(f"--storage {mask_url(url)}: the database cannot be reached "
                          f"({describe_error(exc)}); check the URL, that the server runs and "
                          "that this machine may connect to it") from None
    finally:
        lock.close()


def _cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))  # what this process may use (containers, taskset)
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _counted(study: Any) -> int:
    from prudent.tune.machines import counted

    return len(counted(study.get_trials(deepcopy=False)))


def _measured(study: Any, settings: ProjectSettings, unit: str = "epoch"
              ) -> tuple[int | None, float | None]:
    """The most epochs (or steps) a completed trial ran, and the mean seconds per epoch (or
    step) of finished trials."""
    from prudent.store.database import Store

    finished = [t for t in study.get_trials(deepcopy=False)
                if t.state.is_finished() and t.user_attrs.get("run_id")]
    if not finished:
        return None, None
    key = "steps" if unit == "step" else "epochs"
    complete = [t.user_attrs.get(key) or 0 for t in finished if t.state.name == "COMPLETE"]
    store = Store.open(settings.store)
    try:
        rates = []
        for trial in finished:
            run = store.get_run(trial.user_attrs["run_id"])
            done = trial.user_attrs.get(key) or 0
            if run and run["ended_at"] and done:
                rates.append((run["ended_at"] - run["started_at"]) / done)
    finally:
        store.close()
    return (max(complete) if complete else None), (sum(rates) / len(rates) if rates else None)


def _progress(study: Any) -> str:
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] = counts.get(trial.state.name.lower(), 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "new"


def _guess_name(command: Sequence[str]) -> str:
    import re

    scripts = [Path(a).stem for a in command if a.endswith(".py")]
    name = scripts[0] if scripts else Path(command[0]).name
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "study"


def _clear_halt(home: str, name: str) -> None:
    from prudent.tune.study import study_dir

    (study_dir(home, name) / "halt").unlink(missing_ok=True)


def dumps_summary(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2, default=str)
