"""``prudent.init``: settings, hyperparameters, run id and store, wired into a :class:`Run`.

A bad setting or ``--set`` key never starts a run: it prints one line naming the fix and
exits with code 2 (or raises :class:`ConfigError` when ``exit_on_stop=False``).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prudent.distributed.torchrun import Ranks, ranks_from_env
from prudent.kernel.context import RunContext
from prudent.kernel.errors import ConfigError, StoreLocked
from prudent.kernel.events import Component
from prudent.kernel.run import Run
from prudent.kernel.stop import StopKind, StopReason, exit_bad_input
from prudent.kernel.units import validate_run_id
from prudent.launch.spec import LaunchSpec, host_name
from prudent.store.database import LOCKED_WAIT_S, Store
from prudent.store.writer import StoreWriter
from prudent.wiring.config import ProjectSettings, load_settings
from prudent.wiring.hparams import TrackedConfig, apply_overrides

__all__ = ["init", "job_run_id", "new_run_id"]


def init(name: str | None = None, config: Mapping[str, Any] | None = None, *,
         exit_on_stop: bool = True, settings: ProjectSettings | None = None,
         components: Iterable[Component] | None = None, **objects: Any) -> Run:
    """Start (or continue) a run and return it.

    ``config`` is the user's hyperparameters, overridden by ``prudent run --set`` or the tuner;
    ``objects`` (model=..., optimizer=...) are attached as with :meth:`Run.attach`.
    """
    ranks = ranks_from_env()
    try:
        settings = settings or load_settings()
        spec = LaunchSpec.from_env()
        resolved = apply_overrides(config or {}, spec.overrides, ProjectSettings.model_fields)
        made = None if spec.run_id else _shared_run_id(name, ranks)
        run_id = validate_run_id(spec.run_id or made or "")
    except ConfigError as exc:
        return _bad_input(exc, exit_on_stop)
    name = spec.name or name or _script_name()
    store = Store.open(settings.store) if ranks.is_main else None
    registration = None if store is None else _registered_or_later(
        lambda: _register(store, run_id, name, resolved, spec), store)
    if components is None:
        from prudent.wiring.components import default_components  # imports torch: not for the CLI

        components = default_components(settings, spec)
    context = RunContext(  # run.config notes the keys the script reads (see watches/unread_config.py)
        run_id=run_id, name=name, config=TrackedConfig(resolved), home=settings.store.home, store=store,
        writer=StoreWriter(store, settings.store.flush_interval_s, registration=registration)
        if store is not None else None,
        settings=settings, exit_on_stop=exit_on_stop, components=components,
        handle_signals=settings.run.handle_signals)
    context.id_was_made = made is not None and _launcher_job_id(ranks) is None
    run = Run(context, settings.run, smoke=spec.smoke)
    try:
        context.start()
        if objects:
            run.attach(**objects)
    except ConfigError as exc:
        context.finish("failed", StopReason(StopKind.ERROR, None, str(exc)), str(exc))
        return _bad_input(exc, exit_on_stop)
    return run


def _bad_input(exc: ConfigError, exit_on_stop: bool) -> Run:
    """A bad setting or override: one line naming the fix, exit code 2 (or raise)."""
    if not exit_on_stop:
        raise exc
    exit_bad_input(str(exc))


def new_run_id(name: str) -> str:
    slug = _slug(name)
    return f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def _shared_run_id(name: str | None, ranks: Ranks,
                   environ: Mapping[str, str] | None = None) -> str:
    """Every rank on every node must name the same run, without a flag (each node inventing
    its own id leaves phantom runs): the job's id from its launcher, most specific first:
    torchrun's rendezvous id (``--rdzv-id``; "none" when not given), SLURM's job id (the same
    on every node and across a requeue), SkyPilot's task id (the same on every node and
    across a recovery). Characters a run id cannot hold become '-'."""
    job_id = _launcher_job_id(ranks, environ)
    if job_id is None:
        return new_run_id(name or _script_name())
    return job_run_id(name or _script_name(), job_id)


def _launcher_job_id(ranks: Ranks, environ: Mapping[str, str] | None = None) -> str | None:
    """The job's id from its launcher (the same on every node and on a relaunch), for a
    distributed run; None otherwise."""
    env = os.environ if environ is None else environ
    ids = [env.get(var, "") for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SKYPILOT_TASK_ID")]
    job_id = next((i for i in ids if i and i != "none"), None)
    return job_id if ranks.is_distributed else None


def job_run_id(name: str, job_id: str) -> str:
    """``<name>-<job id>``: the run id every node of one job derives alike from its
    launcher's id (characters a run id cannot hold become '-')."""
    return f"{_slug(name)}-{re.sub(r'[^A-Za-z0-9._-]+', '-', job_id)}"[:128]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:40] or "run"


def _registered_or_later(register: Callable[[], None], store: Store) -> Callable[[], None] | None:
    """Register now, or, while another process holds the store's write lock (a ``sqlite3``
    shell, a backup), after one line: the run trains meanwhile and the store writer
    registers it once the lock is free, before the rows it kept (returned: None when done)."""
    try:
        with store.waiting_at_most(LOCKED_WAIT_S):
            register()
    except StoreLocked:
        print(f"prudent: the run store {store.url} has been locked by another process for "
              f"{LOCKED_WAIT_S:.0f} s (a sqlite3 shell, a backup, a long write): training starts "
              "without it; the run is registered and its rows written once the lock is free, "
              "or kept in its record beside the checkpoints if it never is",
              file=sys.stderr, flush=True)
        return register
    return None


def _register(store: Store, run_id: str, name: str, config: dict[str, Any],
              spec: LaunchSpec) -> None:
    fields = {"config": config, "host": host_name(), "pid": os.getpid()}
    existing = store.get_run(run_id)
    if existing is None:
        store.create_run(run_id, name, command=shlex.join(sys.argv), **fields)
        return
    if not spec.supervised:  # the supervisor counts its own relaunches
        store.count_restart(run_id)
    store.update_run(run_id, name=name, status="running", stop_reason=None, ended_at=None,
                     **fields)


def _script_name() -> str:
    return Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else "run"
