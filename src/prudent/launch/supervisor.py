"""``prudent run``: launch the training script as a child, watch it, record how it ended.

The child learns its run id, settings and ``--set`` overrides from its launch spec
(``launch/spec.py``), so the script is unchanged. Output is inherited (a terminal stays a terminal,
so progress bars work). SIGINT/SIGTERM/SIGHUP reach the child once each; a third signal kills
it. If the child dies without closing its record (SIGKILL, OOM, a crash before
``prudent.init``), the supervisor closes it from the exit status, so ``prudent show`` never lies
with "running"; a child ended by the preemption notice the supervisor passed on, before its
script could handle it, is a preempted run (exit 75), as if it had stopped itself. A child
refused before it started (exit code 2 before ``prudent.init`` recorded anything: a mistyped
``--set`` key) leaves no run at all. A launcher that flattens every worker's code to 1
(torchrun) does not hide how the job ended: when this attempt's record says the run stopped
(preempted, a rule, a budget ...), ``prudent run`` exits with the record's code, not with 1.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from prudent.kernel.errors import ConfigError, ExitCode, StoreError, StoreLocked
from prudent.kernel.events import EventKind
from prudent.kernel.stop import ENV_LAUNCHER_ERROR_FILE, StopReason
from prudent.kernel.units import validate_run_id
from prudent.launch.spawn import SignalForwarder, spawn
from prudent.launch.spec import LaunchSpec, host_name
from prudent.store.database import LOCKED_WAIT_S, Store, run_folder
from prudent.wiring.config import ProjectSettings
from prudent.wiring.session import job_run_id as session_job_run_id
from prudent.wiring.session import new_run_id

__all__ = ["Supervisor"]

# what a platform sends before it takes the machine: SIGTERM, SLURM's SIGUSR1 warning
PREEMPTION_SIGNALS = frozenset({signal.SIGTERM, *((signal.SIGUSR1,)
                                                  if hasattr(signal, "SIGUSR1") else ())})



class Supervisor:
    """Supervises one run. ``spec`` adds to what the child is told (settings given on the
    command line, a tuning trial); ``extra_env`` sets other variables of the child's."""

    def __init__(self, command: Sequence[str], settings: ProjectSettings, *,
                 run_id: str | None = None, name: str | None = None,
                 overrides: Mapping[str, Any] | None = None,
                 config_path: str | None = None, max_restarts: int = 0,
                 restart_backoff_s: float = 1.0, spec: LaunchSpec | None = None,
                 extra_env: Mapping[str, str] | None = None) -> None:
        if not command:
            raise ConfigError("no command to run: write it after '--', "
                              "e.g. prudent run -- python train.py")
        self.command = list(command)
        self.settings = settings
        self.name = name
        self.run_id = validate_run_id(run_id or job_run_id(command, name or _guess(command))
                                      or new_run_id(name or _guess(command)))
        self.overrides = dict(overrides or {})
        self.config_path = config_path
        if max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {max_restarts}")
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.spec = spec or LaunchSpec()
        self.extra_env = dict(extra_env or {})
        # torchrun's own error file (see _reported_code): the user's, or one of ours
        self._error_file = os.environ.get(ENV_LAUNCHER_ERROR_FILE) or str(
            Path(tempfile.gettempdir()) / f"prudent-{self.run_id}-{os.getpid()}-launcher.json")
        self.forwarder = SignalForwarder("prudent: third signal, killing the training process")

    @property
    def signals_seen(self) -> int:
        """SIGINT/SIGTERM/SIGHUP received while supervising: any one means no relaunch."""
        return self.forwarder.signals_seen

    def run(self) -> int:
        """Launch, wait, record, relaunch while allowed; returns the CLI's exit code."""
        store = Store.open(self.settings.store)
        try:
            done = store.get_run(self.run_id) or self._completed_elsewhere()
            if done is not None and done["status"] == "completed" and not _end_was_cut(done):
                # a finished run stays finished: resumed, it would train its last steps
                # again (twice the rows, a restart counted, the duration inflated)
                print(f"prudent | {self.run_id} | already completed at step {done['step']}; "
                      "nothing trained: give another --run-id to train again",
                      file=sys.stderr, flush=True)
                return 0
            with self.forwarder:
                return self._supervise(store)
        finally:
            store.close()
            if not os.environ.get(ENV_LAUNCHER_ERROR_FILE):
                Path(self._error_file).unlink(missing_ok=True)

    def _completed_elsewhere(self) -> dict[str, Any] | None:
        """The run as its record beside its checkpoints tells it, when this store never heard
        that it completed: on another machine (a new VM, a fresh home, shared checkpoints),
        or here while another process held the store's lock all along. None when the record
        says nothing."""
        from prudent.checkpoint.storage import default_location, open_storage
        from prudent.record.importer import read_record

        run_dir = run_folder(self.settings.store.home, self.run_id)
        location = self.settings.checkpoint.location(
            self.run_id, default_location(self.run_id, run_dir))
        if "://" not in location and not Path(location).is_dir():
            return None  # nothing here ever ran (and no folder is made to find that out)
        try:
            record = read_record(open_storage(location), self.run_id)
        except Exception:  # noqa: BLE001 - the training process reads it again, and says why
            return None
        ends = [a for a in (record.attempts.values() if record else ()) if a.status == "completed"]
        if not ends:
            return None
        return {"status": "completed", "step": max(a.step for a in ends)}

    def _supervise(self, registered_in: Store) -> int:
        try:
            with registered_in.waiting_at_most(LOCKED_WAIT_S):
                created = self._register(registered_in)
        except StoreLocked:  # the training process registers it when the lock is free, and
            created = False  # says so
        store = cast(Store, _BestEffortStore(registered_in))
        attempt = 0
        while True:
            launched = self._launch_and_wait()
            reported = self._reported_code(launched)  # torchrun's traceback said a worker's
            code = reported or launched
            code = self._preempted_launcher(store, self._preempted_while_starting(store, code))
            if created and attempt == 0 and self._refused(store, code):
                store.delete_run(self.run_id)  # nothing ran: no run to list
                return code
            self._close_record(store, code)
            record = store.get_run(self.run_id)  # this attempt's: running at each launch
            code = _job_code(code, record)
            if reported:
                self._say_after_launcher(code, record)
            if not self._should_relaunch(code, attempt, record):
                return code if code >= 0 else 128 - code
            attempt += 1
            self._wait_before_relaunch(store, code, attempt)
            if self.signals_seen:
                return code if code >= 0 else 128 - code
            store.count_restart(self.run_id)

    def _preempted_while_starting(self, store: Store, code: int) -> int:
        """A preemption notice this supervisor passed on, which the child died of: it came
        before the script's ``prudent.init`` installed the handler (torch still importing, the
        data still loading). Nothing was trained that the newest checkpoint does not hold, and
        the platform must resume the run, not count a crash: exit 75, ``preempted``."""
        if code >= 0 or -code not in PREEMPTION_SIGNALS or -code not in self.forwarder.signals:
            return code
        name = signal.Signals(-code).name
        record = store.get_run(self.run_id)
        if record is not None and record["status"] == "completed":
            return self._end_cut(store, name)
        message = (f"{name} ended the training process before the script could handle it (it "
                   "had not reached prudent.init): a preempted run, resumed from its newest "
                   "checkpoint by the next launch")
        print(f"prudent: {message} (exit {int(ExitCode.PREEMPTED)})", file=sys.stderr, flush=True)
        _event(store, self.run_id, "preempted_while_starting", message, signal=name)
        return int(ExitCode.PREEMPTED)

    def _end_cut(self, store: Store, name: str) -> int:
        """The notice came after the run completed, in the code after ``with run:`` (saving,
        exporting, testing the model), which it cut: the run stays completed, and the next
        launch runs the script again from its newest checkpoint to finish that code (exit 75;
        the record's exit code 75 tells that launch that its end was cut)."""
        message = (f"{name} ended the training process after its run completed, in the code "
                   "after `with run:` (saving, exporting, testing), which did not finish: the "
                   "next launch runs the script again from the newest checkpoint to finish it")
        print(f"prudent: {message} (exit {int(ExitCode.PREEMPTED)})", file=sys.stderr, flush=True)
        _event(store, self.run_id, "end_cut", message, signal=name)
        store.update_run(self.run_id, exit_code=int(ExitCode.PREEMPTED))
        return int(ExitCode.PREEMPTED)

    def _should_relaunch(self, code: int, attempt: int,
                         record: dict[str, Any] | None = None) -> bool:
        """Preemption and crashes are relaunched; completion, stops and bad input are not.

        The run's own record wins over the exit code: torchrun reports any worker's non-zero
        exit as 1, which would make a rule's stop look like a crash.
        """
        if attempt >= self.max_restarts or self.signals_seen:
            return False
        if record is not None and record["status"] in ("completed", "stopped"):
            return record["stop_reason"] == "preempted" or _end_was_cut(record)
        return code == ExitCode.PREEMPTED or code == ExitCode.ERROR or code < 0

    def _wait_before_relaunch(self, store: Store, code: int, attempt: int) -> None:
        import time

        delay = min(self.restart_backoff_s * 2 ** (attempt - 1), 60.0)
        message = (f"relaunch {attempt} of {self.max_restarts} after exit code {code}, "
                   f"in {delay:.1f} s; the new process resumes from the newest checkpoint")
        print(f"prudent: {message}", file=sys.stderr, flush=True)
        _event(store, self.run_id, "relaunch", message, attempt=attempt, code=code, delay_s=delay)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not self.signals_seen:
            time.sleep(min(0.1, delay))

    def _register(self, store: Store) -> bool:
        """Create the run's record (True), or count a restart of an existing one (False)."""
        if store.get_run(self.run_id) is None:
            store.create_run(self.run_id, self.name or _guess(self.command),
                             command=shlex.join(self.command), host=host_name())
            return True
        store.count_restart(self.run_id)
        _event(store, self.run_id, "relaunch", "prudent run continues this run")
        return False

    def _refused(self, store: Store, code: int) -> bool:
        """The child exited with bad input (a rejected --set, a bad setting) before its
        ``prudent.init`` recorded anything, or at its start (checkpoints that cannot be
        written, a record that cannot be read) before any step: the record this supervisor
        made holds no run."""
        if code != ExitCode.BAD_INPUT:
            return False
        run = store.get_run(self.run_id)
        if run is None or run["step"]:
            return False
        if run["status"] == "running":
            return not store.events(self.run_id) and not store.count_metrics(self.run_id)
        # refused at its start: its end wrote a summary (the machine's metrics), no step ran
        return run["status"] == "failed" and run["stop_reason"] == "error"

    def child_spec(self) -> LaunchSpec:
        """What the child is told: ``spec`` with this run, its overrides and its store."""
        settings = {**self.spec.settings,
                    ("store", "home"): str(Path(self.settings.store.home).resolve())}
        if self.settings.store.url:
            settings[("store", "url")] = self.settings.store.url
        config_path = str(Path(self.config_path).resolve()) if self.config_path else None
        return replace(self.spec, run_id=self.run_id, name=self.name or self.spec.name,
                       overrides=self.overrides, supervised=True, settings=settings,
                       config_path=config_path or self.spec.config_path)

    def _preempted_launcher(self, store: Store, code: int) -> int:
        """torchrun given the preemption notice this supervisor passed on: it sends it to its
        workers (which stop, 75) and then exits 1 with no error file. On a node whose ranks
        write no record (all but rank 0's) nothing else says so: a preempted run, exit 75."""
        if code != ExitCode.ERROR or not PREEMPTION_SIGNALS & set(self.forwarder.signals):
            return code
        record = store.get_run(self.run_id)
        if record is None or record["status"] != "running":
            return code  # the record tells (rank 0's node): _job_code reads it
        message = ("the launcher exited 1 after passing on the preemption notice to the "
                   "training processes: a preempted run, resumed from its newest checkpoint")
        print(f"prudent: {message} (exit {int(ExitCode.PREEMPTED)})", file=sys.stderr, flush=True)
        return int(ExitCode.PREEMPTED)

    def _reported_code(self, code: int) -> int | None:
        """torchrun's 1 made this node's workers' code again: torchrun copies the first failed
        worker's error file (prudent's workers write one when they stop, ``tell_launcher``),
        with its exit code, into the file this supervisor gave it. The one way a node whose
        ranks write no record (all but rank 0's) learns why they stopped. None: torchrun's
        1 carried no worker's code (a real crash, or no torchrun), or it was not a 1."""
        if code != ExitCode.ERROR:
            return None
        try:
            error = json.loads(Path(self._error_file).read_text())
            worker_code = int(error["message"]["errorCode"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # no file: a real crash (or no torchrun)
        # a worker torchrun itself ended (SIGTERM once another worker had exited, even with
        # 75) says nothing of the job: the record, or the 1, does
        return worker_code if worker_code > 0 else None

    def _say_after_launcher(self, code: int, record: dict[str, Any] | None) -> None:
        """torchrun ends a job whose worker stopped with its ChildFailedError traceback, the
        last thing on the screen: one line after it says how the run ended, and where to read
        why."""
        record = record or {}
        status = str(record.get("status") or "ended")
        if record.get("stop_reason"):
            status += f" ({record['stop_reason']})"
        print(f"prudent | {self.run_id} | {status}, exit {code}: torchrun's ChildFailedError "
              "above only reports that exit; prudent's lines before it say why",
              file=sys.stderr, flush=True)

    def _launch_and_wait(self) -> int:
        Path(self._error_file).unlink(missing_ok=True)  # a previous launch's
        extra = {ENV_LAUNCHER_ERROR_FILE: self._error_file, **self.extra_env}
        try:
            child = self.forwarder.add(spawn(self.command, self.child_spec(), extra=extra))
        except OSError as exc:
            print(f"prudent: error: cannot start {self.command[0]!r}: {exc.strerror}"
                  f"{_start_hint(self.command[0])}", file=sys.stderr)
            return 127
        return child.wait()

    def _close_record(self, store: Store, code: int) -> None:
        import time

        try:
            run = store.get_run(self.run_id)
            if run is None or run["status"] != "running":
                _event(store, self.run_id, "exit", f"process exited with code {code}", code=code)
                return
            status, reason, message = _verdict(code)
            if not store.close_if_running(self.run_id, status=status, stop_reason=reason,
                                          ended_at=time.time(), exit_code=code):
                _event(store, self.run_id, "exit", f"process exited with code {code}", code=code)
                return  # closed meanwhile by its own process (rank 0, on another machine)
            _event(store, self.run_id, "end", message, status=status, stop_reason=reason,
                   code=code)
        except StoreError as exc:  # the exit code still says how the run ended
            print(f"prudent: warning: run {self.run_id} exited with code {code} but the store "
                  f"could not record it: {exc}", file=sys.stderr)


def _start_hint(program: str) -> str:
    """Why a program that could not be started most likely could not be, and the fix."""
    if program.endswith(".py") or (Path(program).is_file() and not os.access(program, os.X_OK)):
        return (f" ({program} is a script, not a program: give its interpreter first, "
                f"prudent run -- python {program})")
    if program in ("torchrun", "accelerate", "deepspeed") or "/" not in program:
        return (f" ({program} is not on PATH: activate the environment it is installed in"
                + (", or use python -m torch.distributed.run" if program == "torchrun" else "")
                + ")")
    return ""


def _end_was_cut(record: dict[str, Any]) -> bool:
    """A completed run whose process a preemption notice ended in the code after its
    ``with run:`` block (``Supervisor._end_cut``): launched again, to finish that code."""
    return record["status"] == "completed" and record.get("exit_code") == ExitCode.PREEMPTED


def _job_code(code: int, record: dict[str, Any] | None) -> int:
    """The job's exit code: the child's, unless a launcher flattened the record's stop to 1.

    torchrun (and the elastic agent under it) exits 1 whenever a worker exits non-zero, and
    also after passing on a SIGTERM, so a preempted job (75), a rule's stop (3), a budget (4)
    and the rest all read as crashes to SkyPilot's ``recover_on_exit_codes`` or a Kubernetes
    ``podFailurePolicy``. Rank 0 wrote the job's outcome in the record; when the child exited
    1 and the record says the run *stopped* with a non-zero code, or was refused as bad
    input (2: ranks that resumed from different checkpoints), that code is the job's.
    A record that says ``failed`` (a real crash) or ``completed`` (training ended, then
    something crashed: the process's 1 is the truth) leaves the code as it is, and so does
    any other code: a plain ``python train.py`` already exits with its own. The record is
    this attempt's own: it is set back to ``running`` before every launch (``_register``,
    ``count_restart``), so an ended one was ended by this attempt.
    """
    if code != ExitCode.ERROR or record is None:
        return code
    if record["status"] == "stopped" or record["exit_code"] == ExitCode.BAD_INPUT:
        return int(record["exit_code"] or code)  # a refusal (exit 2) is no crash either
    return code


def _verdict(code: int) -> tuple[str, str | None, str]:
    """Status, stop reason and message for a child that did not close its own record."""
    if code < 0:
        name = signal.Signals(-code).name
        return "failed", "error", f"killed by {name} before prudent could record the end"
    if code == ExitCode.COMPLETED:
        return "completed", None, "process exited with code 0"
    if code == ExitCode.BAD_INPUT:
        return "failed", "error", "bad input: the run did not start (exit code 2)"
    reason = StopReason.from_exit_code(code)
    if reason is not None and not reason.is_failure:
        return "stopped", str(reason), f"process exited with code {code}"
    return "failed", "error", f"process exited with code {code}"


BEST_EFFORT_LOCK_WAIT_S = 30.0


class _BestEffortStore:
    """The store as the supervisor uses it once the run is launched. A store that fails then
    (a full disk, a lock held too long, a server away) is said once and read as empty: it
    never changes the exit code or a relaunch. The run's record beside its checkpoints keeps
    what happened, and the next start imports it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found):
            return found

        def tolerant(*args: Any, **kwargs: Any) -> Any:
            try:  # a lock another process holds: waited for a while, not for good
                with self._store.waiting_at_most(BEST_EFFORT_LOCK_WAIT_S):
                    return found(*args, **kwargs)
            except StoreError as exc:
                if not self.failed:
                    self.failed = True
                    print(f"prudent: warning: {exc}; the run's exit code and relaunches do not "
                          "depend on it (its record beside the checkpoints is imported at the "
                          "next start)", file=sys.stderr, flush=True)
                return None

        return tolerant


def _event(store: Store, run_id: str, name: str, message: str, **payload: Any) -> None:
    import json
    import time

    store.add_events([{"run_id": run_id, "step": _last_step(store, run_id), "kind": EventKind.SUPERVISOR.value,
                       "name": name, "message": message, "payload": json.dumps(payload),
                       "wall": time.time()}])


def _last_step(store: Store, run_id: str) -> int:
    run = store.get_run(run_id)
    return int(run["step"] or 0) if run else 0


def job_run_id(command: Sequence[str], name: str) -> str | None:
    """The run id every node's ``prudent run`` derives alike from a torchrun command's
    ``--rdzv-id`` (each node inventing its own would split one job into phantom runs, each
    with checkpoints of its own): ``<name>-<rdzv id>``. None without one (``--standalone``
    draws a new id per launch: not a job's)."""
    rdzv_id = None
    for i, arg in enumerate(command):
        if arg in ("--rdzv-id", "--rdzv_id") and i + 1 < len(command):
            rdzv_id = command[i + 1]
        elif arg.startswith(("--rdzv-id=", "--rdzv_id=")):
            rdzv_id = arg.split("=", 1)[1]
    if not rdzv_id or rdzv_id == "none":
        return None
    return session_job_run_id(name, rdzv_id)


def _guess(command: Sequence[str]) -> str:
    scripts = [Path(a).stem for a in command if a.endswith(".py")]
    return scripts[0] if scripts else Path(command[0]).name
