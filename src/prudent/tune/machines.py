"""One study, several machines: heartbeats, retries of a lost machine's trials, one lock.

Across machines the study lives in a database (``--storage postgresql://...``) opened with
Optuna's heartbeat (``RDBStorage(heartbeat_interval=, grace_period=,
heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(...))``). While a worker runs
a trial it records the trial's heartbeat (:class:`TrialHeartbeat`, which also publishes the
trial's spend so far as the user attribute ``spent_usd``, so every machine's budget check sees
it). A machine that vanishes stops beating; the next worker anywhere that picks a trial first
calls ``optuna.storages.fail_stale_trials``: the silent trial becomes FAIL and Optuna enqueues
a retry with its parameters, user attributes (its ``run_id``) and reports. The worker that
pops the retry resumes that run from its checkpoint (which must be on storage both machines
reach: ``checkpoint.url``), so the work goes on under the same run id and no trial is run twice.

"Count the trials, check the budget, ask" is one step across machines: on PostgreSQL it runs
under a session advisory lock (:class:`MachinesLock`), released by the server if the machine
holding it vanishes. A retry chain (the lost trial and the trial that resumed its run) is one
run: it counts once toward ``--trials`` and its cost is the run's.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

__all__ = ["CARRIES_ATTR", "DEFAULT_HEARTBEAT_S", "GRACE_HEARTBEATS", "MAX_RETRIES", "MachinesLock",
           "SPENT_ATTR", "TrialHeartbeat", "chain_costs", "counted", "fail_stale", "heartbeat_options",
           "heartbeat_s_of", "quiet", "retry_of", "superseded"]

log = logging.getLogger("prudent.tune")

DEFAULT_HEARTBEAT_S = 60
GRACE_HEARTBEATS = 3  # a trial silent for this many heartbeats has lost its machine
MAX_RETRIES = 3  # a trial whose machine is lost this many times is left failed
SPENT_ATTR = "spent_usd"  # a running trial's spend so far, published with its heartbeat
CARRIES_ATTR = "carries_spend"  # the trial's run record travels (a shared checkpoint.url)


@contextmanager
def quiet() -> Iterator[None]:
    """Optuna's heartbeat API is marked experimental; using it on purpose is not news."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used "
                                "with Study.optimize")
        yield


def _retry_class() -> tuple[Any, str]:
    """Optuna's retry callback and RDBStorage's argument for it (renamed in Optuna 4.9)."""
    import optuna

    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is None:
        return optuna.storages.RetryFailedTrialCallback, "failed_trial_callback"
    return retry, "heartbeat_stale_trial_callback"


def heartbeat_options(interval_s: int) -> dict[str, Any]:
    """``RDBStorage``'s keyword arguments for heartbeats every ``interval_s`` and retries."""
    retry, key = _retry_class()
    with quiet():
        callback = retry(max_retry=MAX_RETRIES, inherit_intermediate_values=True)
    return {"heartbeat_interval": int(interval_s),
            "grace_period": int(interval_s) * GRACE_HEARTBEATS, key: callback}


def open_rdb(url: str, interval_s: int | None) -> optuna.storages.RDBStorage:
    import optuna
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    from prudent.store.database import database_url

    options = heartbeat_options(interval_s) if interval_s else {}
    for attempt in range(4):
        try:
            with quiet():  # postgresql:// with psycopg 3 without psycopg2, as the store
                return optuna.storages.RDBStorage(database_url(url), **options)
        except (IntegrityError, ProgrammingError):
            # two machines that start a study at once both create Optuna's tables; the
            # one that loses the race (PostgreSQL: "duplicate key ... alembic_version")
            # finds them made when it opens the storage again
            time.sleep(0.2 * (attempt + 1))
    with quiet():
        return optuna.storages.RDBStorage(database_url(url), **options)


def heartbeat_s_of(storage: Any) -> int | None:
    """The storage's heartbeat interval; None when it has none (a journal file, no heartbeat)."""
    get = getattr(storage, "get_heartbeat_interval", None)
    return get() if get is not None else None


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose machine stopped beating; Optuna enqueues their retries."""
    import optuna

    with quiet():
        optuna.storages.fail_stale_trials(study)


def retry_of(trial: optuna.trial.FrozenTrial) -> int | None:
    """The number of the lost trial this one retries (the first of the chain), or None."""
    with quiet():
        return _retry_class()[0].retried_trial_number(trial)


def _history(trial: optuna.trial.FrozenTrial) -> list[int]:
    with quiet():
        return list(_retry_class()[0].retry_history(trial))


def superseded(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[int, int]:
    """{lost trial: the trial that retried it} for every trial whose run another continued."""
    found: dict[int, int] = {}
    for trial in trials:
        history = _history(trial)
        for earlier, later in zip(history, history[1:] + [trial.number]):
            found[earlier] = later
    return found


def counted(trials: Iterable[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials that count toward ``--trials``: not waiting, not the fatal one, and a lost
    trial not twice (its retry is the same run)."""
    trials = list(trials)
    retried = superseded(trials)
    return [t for t in trials if t.state.name != "WAITING" and not t.user_attrs.get("fatal")
            and t.number not in retried]


def chain_costs(trials: Iterable[optuna.trial.FrozenTrial], cost_of: Callable[[Any], float]
                ) -> list[tuple[float, bool]]:
    """(dollars, finished) of each run of the study: a retry chain is one run.

    When the run's record travels with its checkpoints, the retry's run already counts the
    lost machine's spend (it imported it): the chain costs the most any of its trials knew.
    Otherwise the retry started afresh and the chain costs the sum.
    """
    chains: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for trial in trials:
        if trial.user_attrs.get("fatal") and trial.state.name == "WAITING":
            continue
        key = trial.user_attrs.get("run_id") or f"#{trial.number}"
        chains.setdefault(key, []).append(trial)
    found = []
    for chain in chains.values():
        chain.sort(key=lambda t: t.number)
        if all(t.state.name == "WAITING" for t in chain) and len(chain) == 1:
            continue  # enqueued, never started
        costs = [cost_of(t) for t in chain]
        carried = all(t.user_attrs.get(CARRIES_ATTR) for t in chain)
        total = max(costs) if carried else sum(costs)
        found.append((total, chain[-1].state.is_finished()))
    return found


class MachinesLock:
    """"Count, check the budget, ask" as one step for every machine of a PostgreSQL study.

    A session advisory lock on a connection of its own: the server releases it when the
    connection dies with its machine. Other storages need none (a journal file or SQLite is
    one machine's, and its workers already take turns through ``study_lock``).
    """

    def __init__(self, url: str, study: str | None) -> None:
        """``study`` None: the lock of the whole database (creating Optuna's tables and a
        study: machines starting at once on a new database would race)."""
        self.url = url if url.startswith("postgresql") else None
        digest = hashlib.sha256(f"prudent-tune:{study or ''}".encode()).digest()
        self.key = int.from_bytes(digest[:8], "big", signed=True)
        self._engine: Any = None

    @contextmanager
    def held(self) -> Iterator[None]:
        if self.url is None:
            yield
            return
        import sqlalchemy as sa

        from prudent.store.database import database_url

        if self._engine is None:
            self._engine = sa.create_engine(database_url(self.url), poolclass=sa.pool.NullPool)
        with self._engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": self.key})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
                conn.commit()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


class TrialHeartbeat:
    """While a worker runs a trial: the trial's heartbeat and its spend so far, every interval.

    On its own thread; a storage error is logged once and retried at the next beat (the
    trial is failed by another machine only after ``GRACE_HEARTBEATS`` silent intervals).
    """

    def __init__(self, storage: Any, trial_id: int, spent: Callable[[], float | None]) -> None:
        self.storage, self.trial_id, self.spent = storage, trial_id, spent
        self.interval_s = heartbeat_s_of(storage)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published: float | None = None
        self._failures = 0

    def __enter__(self) -> TrialHeartbeat:
        if self.interval_s:
            self.beat()  # at once: a trial that is running is never stale
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="prudent-trial-heartbeat")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def beat(self) -> None:
        try:
            self.storage.record_heartbeat(self.trial_id)
            spent = self.spent()
            if spent is not None and spent != self._published:
                self.storage.set_trial_user_attr(self.trial_id, SPENT_ATTR, round(spent, 6))
                self._published = spent
        except Exception as exc:  # noqa: BLE001 - a heartbeat must never take the trial down
            self._failures += 1
            if self._failures == 1:
                log.warning("prudent could not record trial %s's heartbeat (%s); retrying",
                            self.trial_id, exc)
