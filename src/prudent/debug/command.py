"""``prudent replay``: reproduce a failed step on this machine, in the user's unchanged script.

``prudent replay BUNDLE -- python train.py`` checks the bundle (a corrupted one is refused, exit
2), then runs the script in a fresh replay run whose launch spec points at the bundle.
``prudent replay RUN --step S -- python train.py`` copies the newest checkpoint of RUN before
step S into a fresh replay run (the original's checkpoints are only read) and runs the script to
step S in debug mode. Either way the script's report (``replay.json``) is printed; the exit code
is 0 when the failure was reproduced, 1 when not, 2 for bad input.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import typer

from prudent.kernel.errors import ConfigError, ExitCode
from prudent.launch.spawn import spawn
from prudent.launch.spec import ENV_SUPERVISED, LaunchSpec, ReplaySpec
from prudent.store.database import Store, resolve_run, run_folder
from prudent.wiring.config import ProjectSettings, load_settings

__all__ = ["replay", "replay_command"]


def replay(
    context: typer.Context,
    target: str = typer.Argument(..., metavar="BUNDLE|RUN", help="A capture bundle folder "
                                 "(.prudent/runs/<run>/captures/step-<N>), or a run id with "
                                 "--step."),
    command: list[str] | None = typer.Argument(None, help="The training command, after --."),
    step: int | None = typer.Option(None, "--step", metavar="STEP", help="Without a bundle: resume RUN from "
                                       "its newest checkpoint before this step and run to it "
                                       "in debug mode."),
    use_pdb: bool = typer.Option(False, "--pdb", help="Stop in the debugger at the failure."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    config: str | None = typer.Option(None, "--config", "-c", metavar="FILE",
                                         help="Settings file (default ./prudent.yaml)."),
) -> None:
    """Reproduce a captured failing step on this machine, in your unchanged script.

    Example: prudent replay baseline --step 40 -- python train.py
    """
    from prudent.launch.training_command import refuse_option_as_program

    refuse_option_as_program(context, command)
    raise typer.Exit(replay_command(target, step, use_pdb, as_json, command or [], config))


def replay_command(target: str, step: int | None, use_pdb: bool, as_json: bool,
                   command: list[str], config_path: str | None) -> int:
    """Run the replay; returns the exit code."""
    from prudent.debug.bundle import read_bundle
    from prudent.wiring.session import new_run_id

    if not command:
        raise ConfigError("no command to replay with: write the training command after '--', "
                          "e.g. prudent replay BUNDLE -- python train.py")
    settings = load_settings(config_path)
    if step is None:
        if not Path(target).exists() and not target.startswith((".", "/")) and "/" not in target:
            raise ConfigError(f"{target!r} is not a capture bundle folder; to replay a run "
                              "without a bundle give the step: prudent replay RUN --step S -- ...")
        bundle = read_bundle(target)
        replay_id = new_run_id(f"replay-{bundle.info.get('run_name') or 'bundle'}")
        replay = ReplaySpec(bundle=str(bundle.path.resolve()), pdb=use_pdb)
        given = dict(_QUIET)  # only the replayed step matters: no checkpoints, rules or profile
        source = {"bundle": str(bundle.path), "run_id": bundle.info.get("run_id")}
        hparams = bundle.info.get("config") or {}
    else:
        replay_id, given, source, hparams = _prepare_step(settings, target, step)
        replay = ReplaySpec(step=step, pdb=use_pdb)
    code = _launch(command, _spec(settings, replay_id, hparams, replay, given, config_path))
    report = _read_report(settings, replay_id)
    if code == ExitCode.BAD_INPUT or report is None:
        return code if code == ExitCode.BAD_INPUT else int(ExitCode.ERROR)
    report |= {"source": source, "replay_run_id": replay_id}
    if step is not None:
        report |= _compare_with_record(settings, source["run_id"], step, report)
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        _print_report(report, sys.stdout)
    return 0 if report.get("reproduced") else int(ExitCode.ERROR)


_QUIET = {("checkpoint", "enabled"): "0", ("monitor", "enabled"): "0",
          ("profile", "enabled"): "0"}


def _spec(settings: ProjectSettings, replay_id: str, hparams: dict[str, Any], replay: ReplaySpec,
          given: dict[tuple[str, str], str], config_path: str | None) -> LaunchSpec:
    given = {**given, ("store", "home"): str(Path(settings.store.home).resolve())}
    if settings.store.url:
        given[("store", "url")] = settings.store.url
    return LaunchSpec(run_id=replay_id, overrides=hparams, replay=replay, settings=given,
                      config_path=str(Path(config_path).resolve()) if config_path else None)


def _prepare_step(settings: ProjectSettings, ref: str, step: int
                  ) -> tuple[str, dict[tuple[str, str], str], dict[str, Any], dict[str, Any]]:
    """Copy RUN's newest checkpoint before ``step`` into a fresh replay run's folder."""
    from prudent.wiring.session import new_run_id

    if step < 1:
        raise ConfigError(f"--step must be >= 1, got {step}")
    store = Store.open(settings.store)
    try:
        run_id = resolve_run(store, ref)
        record = store.get_run(run_id) or {}
    finally:
        store.close()
    replay_id = new_run_id(f"replay-{record.get('name') or run_id}")
    home = Path(settings.store.home).resolve()
    target = run_folder(home, replay_id) / "checkpoints"
    copied = _copy_checkpoint_before(settings, home, run_id, step, target)
    given = {**_QUIET, ("debug", "enabled"): "1", ("checkpoint", "enabled"): "1",
             ("checkpoint", "url"): str(target), ("checkpoint", "every"): "off"}
    print(f"prudent replay: run {run_id} to step {step} in debug mode, from "
          f"{copied or 'the start (no checkpoint before that step)'}; replay run {replay_id}",
          file=sys.stderr, flush=True)
    return replay_id, given, {"run_id": run_id, "checkpoint": copied}, record.get("config") or {}


def _copy_checkpoint_before(settings: ProjectSettings, home: Path, run_id: str, step: int,
                            target: Path) -> str | None:
    from prudent.checkpoint.storage import LocalStorage, open_storage, step_of
    from prudent.checkpoint.writer import MANIFEST_FILE, load_latest

    source = open_storage(settings.checkpoint.location(
        run_id, str(run_folder(home, run_id) / "checkpoints")))
    loaded = load_latest(_StepsBefore(source, step))
    if loaded is None or not loaded.payload:
        return None
    manifest = json.loads(source.read(loaded.name, MANIFEST_FILE) or b"{}")
    copy = LocalStorage(target)
    shards = manifest.get("shards") or {}
    for filename in shards.get("files", {}):  # the models' state, before what names it
        copy.put(shards["folder"], filename, source.read(shards["folder"], filename) or b"")
    handle = copy.begin(loaded.name)
    for filename in [*manifest.get("files", {}), MANIFEST_FILE]:  # the manifest last
        with copy.open_write(handle, filename) as stream:
            stream.write(source.read(loaded.name, filename) or b"")
    copy.commit(handle)
    return f"{loaded.name} (step {step_of(loaded.name)})"


class _StepsBefore:
    """A read-only view of a checkpoint storage that shows only checkpoints before ``step``."""

    def __init__(self, storage: Any, step: int) -> None:
        self.source, self._step = storage, step
        self.url = storage.url

    def checkpoints(self) -> list[str]:
        from prudent.checkpoint.storage import step_of

        return [n for n in self.source.checkpoints() if (step_of(n) or 0) < self._step]

    def __getattr__(self, attribute: str) -> Any:  # reading a checkpoint: the source's own
        return getattr(self.source, attribute)


def _launch(command: list[str], spec: LaunchSpec) -> int:
    """Run the script in this terminal's foreground (pdb needs it); Ctrl-C reaches it directly."""
    from prudent.debug.mode import CUBLAS_WORKSPACE

    cublas = {"CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG",
                                                        CUBLAS_WORKSPACE)}
    try:
        child = spawn(command, spec, extra=cublas, drop=[ENV_SUPERVISED], new_session=False)
    except OSError as exc:
        raise ConfigError(f"cannot start {command[0]!r}: {exc.strerror}") from None
    with child:
        try:
            return child.wait()
        except BaseException as exc:  # as subprocess.run: nothing outlives the command
            if isinstance(exc, KeyboardInterrupt):  # the child got it too: a moment to end
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=0.25)
            child.kill()
            raise


def _read_report(settings: ProjectSettings, replay_id: str) -> dict[str, Any] | None:
    from prudent.debug.replay import REPORT_FILE

    path = run_folder(settings.store.home, replay_id) / REPORT_FILE
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        print(f"prudent replay: the script wrote no replay report ({path}): does it call "
              "prudent.init and train with run.batches / run.backward?", file=sys.stderr)
        return None


def _compare_with_record(settings: ProjectSettings, run_id: str, step: int,
                         report: dict[str, Any]) -> dict[str, Any]:
    """The loss the original run recorded at ``step``, against the replayed one."""
    store = Store.open(settings.store)
    try:
        series = dict(store.metric_series(run_id, settings.monitor.loss_key))
    finally:
        store.close()
    if step not in series:
        return {"recorded_loss": None, "reproduced": bool(report.get("reached")),
                "note": f"run {run_id} recorded no loss at step {step} to compare with"}
    recorded = series[step]
    recorded_text = "nan" if recorded is None else recorded  # the store keeps NaN as NULL
    replayed = report.get("loss")
    if recorded is None:
        same = bool(report.get("non_finite") or report.get("error"))
    else:
        same = isinstance(replayed, float) and replayed == recorded
    return {"recorded_loss": recorded_text, "reproduced": same}


def _print_report(report: dict[str, Any], out: IO[str]) -> None:
    lines = [f"prudent replay: step {report['step']} of run {report['source'].get('run_id')}"]
    if not report.get("reached"):
        lines.append(f"  not reached: {report.get('summary')}")
    if report.get("error"):
        lines.append(f"  raised: {report['error']}")
    if "loss" in report:
        flag = " (not finite)" if report.get("non_finite") else ""
        lines.append(f"  replayed loss: {report['loss']}{flag}  [{report.get('loss_bits')}]")
    for key, label in (("captured_loss", "captured loss"), ("recorded_loss", "recorded loss")):
        if key in report:
            same = "  bit-identical" if report.get("bit_identical") else ""
            lines.append(f"  {label}: {report[key]}{same if key == 'captured_loss' else ''}")
    if report.get("captured_error"):
        lines.append(f"  captured error: {report['captured_error']}")
    if report.get("non_finite_grads"):
        lines.append(f"  non-finite gradients: {', '.join(report['non_finite_grads'])}")
    first = report.get("first_non_finite")
    if first:
        lines.append(f"  first non-finite output: {first['module']} ({first['type']}), "
                     f"batch rows {first['rows']}")
    for o in report.get("offending", []):
        if o["sample_index"] is None:  # a plain iterable, or a batch prefetched by workers
            lines.append(f"  offending batch row: {o['row']} ({o['why']}; its dataset index is "
                         "unknown: the loader is not a map-style DataLoader)")
        else:
            lines.append(f"  offending sample index: {o['sample_index']} (batch row {o['row']}: "
                         f"{o['why']})")
    if report.get("note"):
        lines.append(f"  note: {report['note']}")
    lines.append(f"  device: {', '.join(report.get('device') or ['?'])}; replay run "
                 f"{report['replay_run_id']}")
    lines.append("  verdict: " + ("REPRODUCED" if report.get("reproduced") else "NOT reproduced"))
    out.write("\n".join(lines) + "\n")
