"""The ``prudent`` command line. Bad input: one line on stderr naming the fix, exit code 2."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from prudent.cost import commands as cost_commands
from prudent.debug.command import replay as replay_command
from prudent.kernel.errors import ConfigError, ExitCode, PrudentError
from prudent.launch.spec import LaunchSpec, setting_var
from prudent.preflight.command import preflight as preflight_command
from prudent.report import commands as report_commands
from prudent.store.database import Store, resolve_run
from prudent.store.repair import store_app
from prudent.tune import commands as tune_commands
from prudent.wiring.config import load_settings
from prudent.wiring.hparams import parse_set_args


class _PlainArgument(TyperArgument):
    """An argument as click writes it: ``RUN``, ``[RUN]``, ``[COMMAND]...``; no type label."""

    @property
    def display_name_raw(self) -> str:
        return self.metavar or (self.name or "").upper()

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        return None

    def get_usage_pieces(self, ctx: typer.Context) -> list[str]:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return [name + ("..." if self.nargs != 1 else "")]


class _PlainOption(TyperOption):
    """A flag shows no value; an option its metavar, or its name: ``--run-id RUN_ID``."""

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        if self.is_flag or self.count:
            return None
        return self.metavar or max(self.opts, key=len).lstrip("-").replace("-", "_").upper()


def _plain(thing: Any) -> Any:
    """typer >= 0.26 labels every parameter with its Python type (``<bool>``, ``<str>``) and has
    no setting to turn that off: its own classes become the plain ones above. Only typer's exact
    classes are swapped; a subclass of someone else's keeps its behaviour."""
    plain = {TyperArgument: _PlainArgument, TyperOption: _PlainOption,
             TyperCommand: PrudentCommand, TyperGroup: PrudentGroup}.get(type(thing))
    if plain is not None:
        thing.__class__ = plain
    return thing


class PrudentCommand(TyperCommand):
    """A typer command whose help shows names and metavars, never Python types."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        return [_plain(param) for param in super().get_params(ctx)]


class PrudentGroup(TyperGroup):
    """The same for a group, and for every command and subgroup found under it."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        return [_plain(param) for param in super().get_params(ctx)]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        return _plain(super().get_command(ctx, cmd_name))


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  cls=PrudentGroup,
                  help="Common-sense guardrails for training ML models in the cloud.\n\n"
                       "Example: prudent run -- python train.py")

ConfigOption = typer.Option(None, "--config", "-c", metavar="FILE",
                            help="Settings file (default ./prudent.yaml).")


def _print_version(value: bool) -> None:
    if value:
        from prudent import __version__

        typer.echo(f"prudent {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version,
                                          is_eager=True, help="Print prudent's version.")) -> None:
    """Common-sense guardrails for training ML models in the cloud.

    Example: prudent run -- python train.py
    """


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    context: typer.Context,
    command: list[str] | None = typer.Argument(None, help="The training command, after --."),
    run_id: str | None = typer.Option(None, "--run-id", metavar="RUN",
                                      help="Continue (or name) this run."),
    name: str | None = typer.Option(None, "--name", metavar="NAME",
                                    help="A human name for the run."),
    set_: list[str] | None = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a "
                                          "hyperparameter: --set lr=0.01 (YAML value); "
                                          "repeatable."),
    profile_steps: str | None = typer.Option(
        None, "--profile-steps", metavar="START:STOP", help="Trace the steps after START "
        "through STOP with torch.profiler, e.g. 100:110; trace and top operators go in the "
        "run's folder."),
    max_restarts: int = typer.Option(0, "--max-restarts", metavar="N", help="Relaunch after a "
                                     "preemption or a crash up to N times; each attempt "
                                     "resumes from the newest checkpoint."),
    restart_backoff_s: float = typer.Option(1.0, "--restart-backoff-s", metavar="SECONDS",
                                            help="First wait before a relaunch; doubles each "
                                            "time, at most 60 s."),
    instance: str | None = typer.Option(None, "--instance", metavar="CLOUD:INSTANCE",
                                        help="Where it runs (see `prudent catalog`), for its "
                                        "cost."),
    spot: bool | None = typer.Option(None, "--spot/--on-demand", help="Billed at the spot price."),
    nodes: int | None = typer.Option(None, "--nodes", metavar="N",
                                     help="Machines in the job (price x nodes)."),
    budget_usd: str | None = typer.Option(None, "--budget-usd", metavar="USD", help="Stop with a "
                                          "checkpoint before the run's cost over all attempts "
                                          "passes this (40 or '$40'); exit 4, resumable once "
                                          "raised."),
    max_hours: str | None = typer.Option(None, "--max-hours", metavar="DURATION", help="Stop "
                                         "with a checkpoint before the run's wall time passes "
                                         "this (12, '90min')."),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE", help="Policy file "
                                      "(replaces the policy: section); a job that breaks it "
                                      "exits 6."),
    debug: bool = typer.Option(False, "--debug", help="Debug mode: every event logged, anomaly "
                               "detection, deterministic algorithms, a capture on every rule "
                               f"firing (slow; {setting_var('debug', 'enabled')}=1)."),
    config: str | None = ConfigOption,
) -> None:
    """Supervise a training script: record it, pass --set overrides, forward signals, relaunch.

    Example: prudent run --run-id baseline -- python train.py
    """
    from prudent.launch.supervisor import Supervisor
    from prudent.launch.training_command import refuse_option_as_program
    from prudent.profile import parse_step_window

    refuse_option_as_program(context, command)
    overrides = parse_set_args(set_ or [])
    if profile_steps is not None:
        parse_step_window(profile_steps)  # bad input: exit 2 before anything is written
    given = {("profile", "steps"): profile_steps,
             **cost_commands.cost_settings(instance, spot, nodes, budget_usd, max_hours, policy)}
    settings = load_settings(config, overrides=given)
    debug_env = {"CUBLAS_WORKSPACE_CONFIG": os.environ.get(
        "CUBLAS_WORKSPACE_CONFIG", ":4096:8")} if debug else {}
    spec = LaunchSpec(settings={**given, ("debug", "enabled"): "1" if debug else None})
    supervisor = Supervisor(command or [], settings, run_id=run_id, name=name,
                            overrides=overrides, config_path=config, max_restarts=max_restarts,
                            restart_backoff_s=restart_backoff_s, spec=spec, extra_env=debug_env)
    # a job the policy forbids: exit 6, nothing written (a torchrun command: its processes)
    cost_commands.check_or_exit(settings, command=command or [])
    raise typer.Exit(supervisor.run())


@app.command()
def runs(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    limit: int = typer.Option(20, "--limit", "-n", min=1, metavar="N", help="How many of the "
                              "newest runs."),
    config: str | None = ConfigOption,
) -> None:
    """List runs, newest first.

    Example: prudent runs --limit 5
    """
    store = _store_if_any(config)
    rows = [] if store is None else [_summary(store, r) for r in store.list_runs(limit)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if store is None:
        typer.echo("no runs yet: start one with prudent run -- python train.py")
        return
    table = Table("status", "stop reason", "duration", "steps", "restarts", "cost $",
                  "last metrics")
    table.columns[-1].overflow = "fold"
    table.add_column("id", no_wrap=True)
    for r in rows:
        table.add_row(r["status"], Text(r["stop_reason"] or ""), _duration(r["duration_s"]),
                      str(r["step"]), str(r["restarts"]), f"{r['cost_usd']:.2f}",
                      Text(_metrics_text(r["metrics"])), Text(r["id"]))
    Console(width=max(Console().width, 120)).print(table)


@app.command()
def show(
    run_ref: str = typer.Argument(..., metavar="RUN", help="Run id, a unique prefix, or 'latest'."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    config: str | None = ConfigOption,
) -> None:
    """Everything about one run: status, config, last metrics, events.

    Example: prudent show baseline
    """
    store = _open_store(config)
    run = store.get_run(resolve_run(store, run_ref))
    assert run is not None
    detail = _summary(store, run)
    detail["events"] = [{k: e[k] for k in ("step", "kind", "name", "message", "payload", "wall")}
                        for e in store.events(run["id"])]
    detail["profile"], detail["findings"] = _profile_of(detail["events"])
    if as_json:
        typer.echo(json.dumps(detail, indent=2))
        return
    _print_detail(detail)


@app.command()
def profile(
    run_ref: str = typer.Argument(..., metavar="RUN", help="Run id, a unique prefix, or 'latest'."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    config: str | None = ConfigOption,
) -> None:
    """Where a run's time went (data, compute, checkpoint, eval), and what to change.

    Example: prudent profile baseline
    """
    from prudent.profile.summary import attempts, print_profile

    store = _open_store(config)
    run_id = resolve_run(store, run_ref)
    events = store.events(run_id)
    summary, findings = _profile_of(events)
    if summary is None:
        status = (store.get_run(run_id) or {}).get("status")
        raise ConfigError(f"run {run_id} has no profile ({status}): a profile is written when "
                          "a run ends; profiling was off, or the process was killed first")
    rows = attempts([e["payload"] for e in events
                     if (e["kind"], e["name"]) == ("profile", "summary")])
    if as_json:  # "profile": the newest attempt's, as before; "attempts": each one's
        typer.echo(json.dumps({"id": run_id, "profile": summary, "findings": findings,
                               "attempts": rows}, indent=2))
        return
    print_profile(Console(), run_id, summary, rows)


def _profile_of(events: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The newest profile summary, and the findings recorded with it."""
    summaries = [e for e in events if (e["kind"], e["name"]) == ("profile", "summary")]
    findings = [{"id": e["name"], "step": e["step"], "message": e["message"],
                 "evidence": e["payload"]} for e in events if e["kind"] == "finding"]
    return (summaries[-1]["payload"] if summaries else None), findings


def _open_store(config: str | None) -> Store:
    """The store for a command that only reads it: read-only (an archive on read-only media, a
    store another process is writing). When there is none yet, an error that names where it
    looked and the fix: a read never makes one (a mistyped PRUDENT_HOME would leave an empty
    store behind)."""
    from prudent.report.reader import open_readonly

    return open_readonly(load_settings(config).store)


def _store_if_any(config: str | None) -> Store | None:
    try:
        return _open_store(config)
    except ConfigError:  # no store yet (open_readonly's only error)
        return None


def _summary(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    from prudent.profile.component import PROFILE_METRICS  # the machine's series: not metrics

    ended = run["ended_at"] or (time.time() if run["status"] == "running" else None)
    metrics = {name: value for name, value in store.last_metrics(run["id"]).items()
               if not name.startswith(PROFILE_METRICS)}
    return {
        "id": run["id"], "name": run["name"], "status": run["status"],
        "stop_reason": run["stop_reason"], "config": run["config"],
        "metrics": metrics, "restarts": run["restarts"],
        "cost_usd": run["cost_usd"], "cost": cost_commands.breakdown(store, run["id"]),
        "step": run["step"], "epoch": run["epoch"],
        "host": run["host"], "command": run["command"], "exit_code": run["exit_code"],
        "started_at": run["started_at"], "ended_at": run["ended_at"],
        "duration_s": round(ended - run["started_at"], 3) if ended else None,
    }


def _print_detail(d: dict[str, Any]) -> None:
    console = Console()
    reason = f" ({d['stop_reason']})" if d["stop_reason"] else ""
    console.print(Text.assemble((d["id"], "bold"), f"  {d['name']}  {d['status']}{reason}"))
    console.print(f"host {d['host']}  started {_when(d['started_at'])}  "
                  f"duration {_duration(d['duration_s'])}{_attempts_text(d)}  steps {d['step']}  "
                  f"restarts {d['restarts']}  cost ${d['cost_usd']:.2f}  exit {d['exit_code']}")
    console.print(f"command: {d['command']}", markup=False)
    console.print(f"config: {json.dumps(d['config'])}", markup=False)
    console.print(f"metrics: {_metrics_text(d['metrics'], limit=None)}", markup=False)
    table = Table("step", "kind", "name", "message", title="events")
    for e in d["events"]:
        # messages quote errors and paths ("[/__w/pytorch/...]"): text, never markup
        table.add_row(str(e["step"]), e["kind"], e["name"], Text(e["message"]))
    console.print(table)


def _attempts_text(d: dict[str, Any]) -> str:
    """A resumed run's duration spans the waits between its attempts (a relaunch a day later):
    each attempt's own running time beside it."""
    attempts = (d.get("cost") or {}).get("by_attempt") or []
    if len(attempts) < 2:
        return ""
    each = " + ".join(_duration(a.get("seconds")) for a in attempts)
    return f" ({len(attempts)} attempts: {each})"


def _metrics_text(metrics: dict[str, float | None], limit: int | None = 3) -> str:
    items = sorted(metrics.items())[:limit]
    return " ".join(f"{k}={v:.4g}" if v is not None else f"{k}=nan" for k, v in items)


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def _duration(seconds: float | None) -> str:
    return str(timedelta(seconds=round(seconds))) if seconds is not None else ""


app.command("preflight", context_settings={"allow_extra_args": True,
                                          "ignore_unknown_options": True})(preflight_command)
app.command("replay", context_settings={"allow_extra_args": True,
                                       "ignore_unknown_options": True})(replay_command)
app.add_typer(cost_commands.catalog_app, name="catalog")
app.command("cost")(cost_commands.bill)
app.add_typer(cost_commands.policy_app, name="policy")
app.command("tune", context_settings={"allow_extra_args": True,
                                     "ignore_unknown_options": True})(tune_commands.tune)
app.command("study")(tune_commands.study)
app.command("report")(report_commands.report)
app.command("ui")(report_commands.ui)
app.add_typer(store_app, name="store")


# typer >= 0.26 raises its own copy of click's exceptions: the class is found, not named
_CLICK_ERROR: type[Exception] = next(cls for cls in typer.BadParameter.__mro__
                                     if cls.__name__ == "ClickException")


def main() -> None:
    """Entry point: every error is one line ``prudent: error: ...`` on stderr.

    A PrudentError exits 2 (bad input). A usage error (unknown command or option, missing
    argument, bad value) prints click's usage line and help hint above that line, and exits
    with click's code, 2.
    """
    try:
        code = app(standalone_mode=False)  # returns typer.Exit(n)'s n, or the command's None
    except PrudentError as exc:
        _fail(str(exc), int(ExitCode.BAD_INPUT))
    except _CLICK_ERROR as exc:
        _usage_error(exc)
    except typer.Abort:
        _fail("aborted", 1)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_error(exc: Any) -> None:
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # bare `prudent`: the help, not an error
        if exc.format_message().strip():  # rich has printed it already; plain click has not
            exc.show()
        sys.exit(exc.exit_code)
    if ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
        typer.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)
    _fail(_with_given_value(exc, exc.format_message(), sys.argv[1:]), exc.exit_code)


def _with_given_value(exc: Any, message: str, argv: list[str]) -> str:
    """A bad value's message with the value given (typer's own, from pydantic, names the
    option but not what was typed: "Input should be a valid integer")."""
    opts = list(getattr(getattr(exc, "param", None), "opts", None) or [])
    if not opts or not message.startswith("Invalid value"):
        return message
    given = None
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word in opts and i + 1 < len(argv):
            given = argv[i + 1]
        elif word.startswith("--") and word.partition("=")[0] in opts:
            given = word.partition("=")[2]
    if given is None or repr(given) in message:
        return message
    head, _, reason = message.partition(": ")
    return f"{head}: {given!r}: {reason}" if reason else f"{message} ({given!r})"


def _fail(message: str, code: int) -> None:
    typer.secho(f"prudent: error: {message}", err=True, fg="red")
    sys.exit(code)


if __name__ == "__main__":
    main()
