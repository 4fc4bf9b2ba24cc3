"""The preflight processes: the user's unchanged script, launched in smoke mode four ways.

::

    smoke     a few batches per epoch, two epochs, checkpoints: the reference run
    overfit   the first batch again and again (starts once the smoke run reached prudent.init)
    stop      the smoke run again, stopped as if preempted mid-way (a checkpoint is written)
    resume    a new process with the same run id: it must continue exactly where 'stop' stopped

Every process gets a throwaway prudent home (a temporary folder, removed afterwards): smoke
runs are not runs the user made, so they must not appear in ``prudent runs`` or the cost
report, and they must never resume from, or prune, the user's real checkpoints.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prudent.kernel.errors import ConfigError
from prudent.launch.spawn import spawn
from prudent.launch.spec import (
    ENV_PREFLIGHT_STOP_AT,
    ENV_RUN_ID,
    ENV_RUN_NAME,
    ENV_SUPERVISED,
    LaunchSpec,
    PreflightSpec,
    setting_var,
)
from prudent.store.database import run_folder

__all__ = ["PhaseResult", "PreflightResult", "PreflightRunner", "choose_stop_step"]

# a user's own values of these must not leak into a smoke run (cost, a relaunch's identity)
_CLEARED = (ENV_RUN_ID, ENV_RUN_NAME, ENV_SUPERVISED, ENV_PREFLIGHT_STOP_AT)
_CLEARED_SETTINGS = (("cost", "instance"), ("cost", "budget_usd"), ("cost", "max_hours"),
                     ("cost", "policy_file"), ("profile", "steps"))


@dataclass
class PhaseResult:
    """How one process ended, and what its probe recorded (None: it never called init)."""

    name: str
    returncode: int | None
    seconds: float
    record: dict[str, Any] | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False

    @property
    def losses(self) -> dict[int, float | None]:
        return {s["step"]: s["loss"] for s in (self.record or {}).get("steps", [])}

    @property
    def status(self) -> str | None:
        return (self.record or {}).get("status")

    @property
    def cut_short(self) -> bool:
        """Smoke mode stopped a loop that counts its own iterations (it cannot end it)."""
        record = self.record or {}
        return (record.get("status") == "stopped" and record.get("stop_reason") == "preflight"
                and record.get("mode") == "smoke")

    @property
    def ran_its_course(self) -> bool:
        """Completed, or ran the smoke run's steps before smoke mode had to stop it."""
        return self.status == "completed" or self.cut_short


@dataclass
class PreflightResult:
    command: list[str]
    steps: int
    seconds: float = 0.0
    phases: dict[str, PhaseResult] = field(default_factory=dict)
    stop_at: int | None = None


class PreflightRunner:
    """Runs the phases; ``run()`` returns what each process recorded."""

    def __init__(self, command: Sequence[str], *, steps: int = 8, timeout_s: float = 300.0,
                 device: str = "cpu", overfit_steps: int = 300, keep: str | None = None) -> None:
        if not command:
            raise ConfigError("no command to check: write it after '--', "
                              "e.g. prudent preflight -- python train.py")
        if steps < 2:
            raise ConfigError(f"--steps must be >= 2, got {steps}: the resume check stops a run "
                              "between two steps")
        if timeout_s <= 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {timeout_s}")
        self.command = list(command)
        self.steps, self.timeout_s, self.device = steps, timeout_s, device
        self.overfit_steps = overfit_steps
        self.keep = keep  # a folder to keep the smoke runs' files in, for a closer look
        self._home = Path()
        self._started: list[_Process] = []
        self._threads = str(max(1, (os.cpu_count() or 2) // 2))  # two processes at a time

    def run(self) -> PreflightResult:
        started = time.monotonic()
        result = PreflightResult(self.command, self.steps)
        home = Path(self.keep) if self.keep else Path(tempfile.mkdtemp(prefix="prudent-preflight-"))
        self._home = home.resolve()
        self._home.mkdir(parents=True, exist_ok=True)
        try:
            with _signals_end_preflight():
                self._run_phases(result)
        finally:
            for process in self._started:  # Ctrl-C, SIGTERM or an error: no orphan trains on
                if process.popen.poll() is None:
                    _kill_group(process.popen)
            if not self.keep:
                shutil.rmtree(home, ignore_errors=True)
        result.seconds = time.monotonic() - started
        return result

    def _run_phases(self, result: PreflightResult) -> None:
        """Two processes at a time: smoke with stop, then overfit with resume.

        The stop process is started before the smoke run's epochs are known, betting on at least
        two of them; a one-epoch script never reaches that step and is stopped again earlier.
        """
        phases = result.phases
        smoke = self._start("smoke", "smoke")
        if not self._reached_init(smoke):
            phases["smoke"] = self._finish(smoke)
            return
        guess = self.steps + max(1, self.steps // 2)
        stop = self._start("stop", "resume", stop_at=guess)
        phases["smoke"] = self._finish(smoke)
        phases["stop"] = self._finish(stop)
        result.stop_at = choose_stop_step(phases["smoke"], preferred=guess)
        if result.stop_at is not None and result.stop_at != guess:
            self._forget("resume")
            phases["stop"] = self._finish(self._start("stop", "resume", stop_at=result.stop_at))
        overfit = self._start("overfit", "overfit")
        if result.stop_at is None:
            del phases["stop"]  # the smoke run did not complete: nothing to compare a resume with
        elif phases["stop"].status == "stopped":
            phases["resume"] = self._finish(self._start("resume", "resume"))
        phases["overfit"] = self._finish(overfit)

    def _forget(self, run_id: str) -> None:
        """Remove a run's checkpoints and records, so that its id starts afresh."""
        shutil.rmtree(self._home / "checkpoints" / f"preflight-{run_id}", ignore_errors=True)
        shutil.rmtree(run_folder(self._home, f"preflight-{run_id}"), ignore_errors=True)

    # processes ------------------------------------------------------------------------------
    def _start(self, phase: str, run_id: str, stop_at: int | None = None) -> _Process:
        out = self._home / "records" / f"{phase}.json"
        spec = self._spec(phase, f"preflight-{run_id}", out, stop_at)
        # the same thread count in every phase: the same numerics
        threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", self._threads)}
        cleared = [*_CLEARED, *(setting_var(*pair) for pair in _CLEARED_SETTINGS)]
        logs = self._home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{phase}.out", "wb") as stdout, \
                open(logs / f"{phase}.err", "wb") as stderr:
            try:
                popen = spawn(self.command, spec, extra=threads, drop=cleared, stdout=stdout,
                              stderr=stderr, stdin=subprocess.DEVNULL, death_signal=signal.SIGKILL)
            except OSError as exc:
                raise ConfigError(f"cannot start {self.command[0]!r}: {exc.strerror}") from None
        self._started.append(_Process(phase, popen, out, logs, time.monotonic()))
        return self._started[-1]

    def _spec(self, phase: str, run_id: str, out: Path, stop_at: int | None) -> LaunchSpec:
        settings = {
            ("store", "home"): str(self._home),
            ("store", "url"): f"sqlite:///{self._home / 'prudent.db'}",
            ("checkpoint", "url"): str(self._home / "checkpoints" / run_id),
            ("checkpoint", "every"): f"{max(2, self.steps // 2)}steps",
            # preflight judges the steps itself: no rule stops, no capture bundles, no anomaly mode
            ("monitor", "enabled"): "false", ("debug", "capture"): "false",
            ("debug", "enabled"): "false", ("console", "mode"): "off",
            ("run", "device"): self.device}
        asked = PreflightSpec(mode="overfit" if phase == "overfit" else "smoke", steps=self.steps,
                              stop_at=stop_at, out=str(out), overfit_steps=self.overfit_steps)
        return LaunchSpec(run_id=run_id, smoke=True, settings=settings, preflight=asked)

    def _reached_init(self, process: _Process) -> bool:
        """Wait until the script called prudent.init (its probe wrote) or ended."""
        while process.popen.poll() is None and not process.out.exists():
            if time.monotonic() - process.started > self.timeout_s:
                return False
            time.sleep(0.05)
        return process.out.exists()

    def _finish(self, process: _Process) -> PhaseResult:
        left = max(0.1, self.timeout_s - (time.monotonic() - process.started))
        timed_out = False
        try:
            code: int | None = process.popen.wait(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out, code = True, None
            _kill_group(process.popen)
        return PhaseResult(process.name, code, round(time.monotonic() - process.started, 2),
                           _read_record(process.out), _tail(process.logs / f"{process.name}.out"),
                           _tail(process.logs / f"{process.name}.err"), timed_out)


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    logs: Path
    started: float


def choose_stop_step(smoke: PhaseResult, preferred: int | None = None) -> int | None:
    """Where the resume check stops: mid-way through the second epoch (or the first).

    The first epoch's last batch follows a data scan, which the run's data position does not
    count; stopping in the second epoch (or before the scan) keeps the resume exact. A loop
    without epochs (run.steps) has no scan: any step but the last will do, ``preferred`` (the
    step the stop process was started with) if it is one.
    """
    if not smoke.ran_its_course:
        return None
    record = smoke.record or {}
    steps = record["steps"]
    if record.get("num_epochs") is None and not record.get("batches"):
        if preferred is not None and 1 <= preferred < len(steps):
            return preferred
        return len(steps) // 2 if len(steps) >= 2 else None
    first = [s for s in steps if s["epoch"] == 0]
    second = [s for s in steps if s["epoch"] == 1]
    if second:
        return len(first) + max(1, len(second) // 2) if len(second) > 1 else len(first)
    return max(1, (len(first) - 1) // 2) if len(first) >= 3 else None


@contextlib.contextmanager
def _signals_end_preflight() -> Iterator[None]:
    """SIGTERM or SIGHUP (``timeout``, a closed terminal, a CI job cancelled) ends preflight
    as Ctrl-C does: its smoke runs are killed, not asked to stop at their next step (one
    deep in a long evaluation would train on, an orphan). Exit code 128 + the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, end) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _kill_group(popen: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    popen.wait()


def _read_record(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path, limit: int = 20_000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")
