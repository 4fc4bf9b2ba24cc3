"""The tuning side of the command line: ``prudent tune`` and ``prudent study``."""

from __future__ import annotations

import json

import typer

from prudent.kernel.errors import ConfigError

__all__ = ["study", "tune"]

_ConfigOption = typer.Option(None, "--config", "-c", metavar="FILE",
                              help="Settings file (default ./prudent.yaml).")


def tune(
    context: typer.Context,
    command: list[str] | None = typer.Argument(None, help="The training command, after --."),
    space: str = typer.Option(..., "--space", metavar="FILE", help="Search space YAML file."),
    objective: str = typer.Option(..., "--objective", metavar="METRIC", help="The metric the "
                                  "script logs with run.log(NAME=...), e.g. val_acc."),
    direction: str = typer.Option("max", "--direction", metavar="max|min", help="max or min."),
    trials: int = typer.Option(20, "--trials", metavar="N", help="Trials in the study in all (a "
                               "restart runs the ones left)."),
    workers: int = typer.Option(1, "--workers", metavar="N", help="Trials at once, each its own "
                                "process."),
    timeout: str | None = typer.Option(None, "--timeout", metavar="DURATION", help="No new trial "
                                       "starts after this long: 3600, '90min', '2h'."),
    budget_usd: str | None = typer.Option(None, "--budget-usd", metavar="USD", help="No new trial "
                                          "starts when spent + the running trials + one more "
                                          "would pass this (40 or '$40')."),
    sampler: str | None = typer.Option(None, "--sampler", metavar="NAME", help="tpe, gp, cmaes or "
                                       "random (default: tpe)."),
    pruner: str | None = typer.Option(None, "--pruner", metavar="NAME", help="asha, hyperband, "
                                      "median or none (default: asha)."),
    study_name: str | None = typer.Option(None, "--study", metavar="NAME", help="Study name "
                                          "(default: the script's name); the same name continues "
                                          "it."),
    storage: str | None = typer.Option(None, "--storage", metavar="URL", help="Optuna storage "
                                       "URL, e.g. postgresql://... to share a study across "
                                       "machines (default: a journal file under "
                                       ".prudent/studies)."),
    enqueue: list[str] | None = typer.Option(None, "--enqueue", metavar="CONFIG", help="A "
                                             "known-good configuration to try first: JSON or a "
                                             "file; repeatable."),
    warm_start: str | None = typer.Option(None, "--warm-start", metavar="STUDY", help="An earlier "
                                          "study (same storage): its 5 best configurations that "
                                          "fit this space go first."),
    max_epochs: int | None = typer.Option(None, "--max-epochs", metavar="N", help="Epochs of a "
                                          "full trial: the pruner's max resource and the "
                                          "projection."),
    epoch_s: float | None = typer.Option(None, "--epoch-s", metavar="SECONDS", help="Seconds per "
                                         "epoch for the cost projection (default: measured on the "
                                         "study)."),
    set_: list[str] | None = typer.Option(None, "--set", metavar="KEY=VALUE", help="A "
                                          "hyperparameter fixed for every trial: --set "
                                          "max_iters=300 (YAML value); repeatable; not a key the "
                                          "space searches."),
    max_steps: int | None = typer.Option(None, "--max-steps", metavar="N", help="Each trial stops "
                                         "after N optimizer steps and counts as complete (its "
                                         "last logged objective); the pruner's max resource in "
                                         "steps."),
    min_resource: int | None = typer.Option(None, "--min-resource", metavar="N", help="The "
                                            "pruner's first rung, in what trials report at "
                                            "(epochs, or steps in a loop without run.epochs): no "
                                            "trial is pruned before it (default 1)."),
    heartbeat: str | None = typer.Option(None, "--heartbeat", metavar="DURATION", help="With a "
                                         "database --storage: how often each machine's workers "
                                         "record their trials' heartbeat (default 60s); a trial "
                                         "silent for 3 is resumed by another machine."),
    seed: int | None = typer.Option(None, "--seed", metavar="N", help="Sampler seed (worker i "
                                    "uses seed+i)."),
    max_restarts: int = typer.Option(0, "--max-restarts", metavar="N", help="Relaunch a crashed "
                                     "trial up to N times (it resumes from its checkpoint)."),
    instance: str | None = typer.Option(None, "--instance", metavar="CLOUD:INSTANCE", help="Where "
                                        "trials run, as cloud:instance, for their cost."),
    spot: bool | None = typer.Option(None, "--spot/--on-demand", help="Billed at the spot price."),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE", help="Policy file; a "
                                      "study that breaks it (e.g. max_parallel_trials) exits 6."),
    config: str | None = _ConfigOption,
) -> None:
    """Search hyperparameters: each trial a supervised run; weak and sick trials pruned.

    Example: prudent tune --space space.yaml --objective val_acc --trials 2 -- python train.py
    """
    from prudent.launch.training_command import refuse_option_as_program

    refuse_option_as_program(context, command)
    from prudent.cost import commands as cost_commands
    from prudent.kernel.units import parse_duration_s, parse_usd
    from prudent.launch.spec import LaunchSpec
    from prudent.tune.strategy import DEFAULT_PRUNER, DEFAULT_SAMPLER
    from prudent.tune.tuner import TuneOptions, Tuner, parse_enqueue
    from prudent.wiring.config import load_settings
    from prudent.wiring.hparams import parse_set_args

    cost = cost_commands.cost_settings(instance, spot, None, None, None, policy)
    options = TuneOptions(
        command=list(command or []), space=space, objective=objective, direction=direction,
        trials=trials, workers=workers,
        timeout_s=parse_duration_s(timeout) if timeout is not None else None,
        budget_usd=_usd(budget_usd, parse_usd), sampler=sampler or DEFAULT_SAMPLER,
        pruner=pruner or DEFAULT_PRUNER, study=study_name, storage=storage,
        enqueue=parse_enqueue(enqueue or []), max_epochs=max_epochs, epoch_s=epoch_s, seed=seed,
        config_path=config, max_restarts=max_restarts, warm_start=warm_start,
        fixed=parse_set_args(set_ or []), max_steps=max_steps, min_resource=min_resource,
        heartbeat_s=_seconds("--heartbeat", heartbeat, parse_duration_s))
    settings = load_settings(config, overrides=cost)
    # bad space, flags or study: exit 2 before anything runs
    tuner = Tuner(options, settings, spec=LaunchSpec(settings=cost))
    cost_commands.check_or_exit(settings, kind="tune", parallel=workers)
    raise typer.Exit(tuner.run())


def study(
    name: str = typer.Argument(..., help="The study's name (see --study of prudent tune)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    storage: str | None = typer.Option(None, "--storage", metavar="URL", help="Optuna storage URL "
                                          "(default: the journal file under .prudent/studies)."),
    plots: bool = typer.Option(False, "--plots", help="Write the plots into the study's folder."),
    config: str | None = _ConfigOption,
) -> None:
    """A study's best configuration, trials (state, value, epochs, cost), importances.

    Example: prudent study train
    """
    from pathlib import Path

    from prudent.tune.report import print_summary, summarize, write_plots
    from prudent.tune.study import load, open_storage, storage_url, validate_study_name
    from prudent.wiring.config import load_settings

    settings = load_settings(config)
    validate_study_name(name)
    url = storage_url(settings.store.home, name, storage)
    if storage is None and not Path(url).exists():
        raise ConfigError(f"no study {name!r}: {url} does not exist; start one with prudent "
                          f"tune --study {name} --space ... -- python train.py")
    summary = summarize(load(name, open_storage(url)), settings)
    if plots:
        folder = Path(settings.store.home).resolve() / "studies" / name
        summary["plots"] = write_plots(load(name, open_storage(url)), folder)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
        return
    print_summary(summary)


def _seconds(flag: str, value: str | None, parse: object) -> int | None:
    """Whole seconds (Optuna's heartbeat counts in them), at least 1."""
    import math

    if value is None:
        return None
    seconds = float(parse(value))  # type: ignore[operator]
    if seconds <= 0:
        raise ConfigError(f"{flag} must be > 0, got {value!r}: e.g. {flag} 60s")
    return max(1, math.ceil(seconds))


def _usd(value: str | None, parse: object) -> float | None:
    if value is None:
        return None
    return float(parse(value))  # type: ignore[operator]
