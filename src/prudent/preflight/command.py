"""``prudent preflight -- python train.py``: the command, wired from the pieces of this package."""

from __future__ import annotations

import typer

__all__ = ["preflight"]


def preflight(
    context: typer.Context,
    command: list[str] | None = typer.Argument(None, help="The training command, after --."),
    steps: int = typer.Option(8, "--steps", metavar="N", help="Batches per epoch in the smoke run (two "
                              "epochs run); the first epoch's data is also read in full. A "
                              "run.steps(n) loop runs twice this many iterations."),
    instance: str | None = typer.Option(None, "--instance", metavar="CLOUD:INSTANCE", help="Target machine as "
                                           "cloud:instance (see `prudent catalog`), for the "
                                           "projected cost."),
    spot: bool = typer.Option(False, "--spot", help="Project with the instance's spot price."),
    price_per_hour: float | None = typer.Option(None, "--price-per-hour", metavar="USD", help="Your own "
                                                   "price in USD per hour (wins over the "
                                                   "catalog)."),
    speedup: float | None = typer.Option(None, "--speedup", metavar="X", help="How many times faster than "
                                            "this machine the target runs a step (default: none "
                                            "applied, and said so)."),
    device: str = typer.Option("cpu", "--device", metavar="cpu|cuda", help="Where the smoke runs train: cpu, or "
                               "cuda on the target machine for a measured step time."),
    timeout_s: float = typer.Option(300.0, "--timeout", metavar="SECONDS", help="Seconds each process may take."),
    as_json: bool = typer.Option(False, "--json", help="Print the checklist as JSON."),
    keep: str | None = typer.Option(None, "--keep", metavar="DIR", help="Keep the smoke runs' files "
                                       "(logs, checkpoints, probe records) in this folder."),
    config: str | None = typer.Option(None, "--config", "-c", metavar="FILE", help="Settings file (for "
                                         "cost.catalog_file)."),
) -> None:
    """Run the script on CPU on a few batches and check what would fail hours into a cloud run.

    Example: prudent preflight --steps 4 -- python train.py
    """
    from prudent.launch.training_command import refuse_option_as_program

    refuse_option_as_program(context, command)
    from prudent.preflight.checks import run_checks
    from prudent.preflight.projection import price_for, project
    from prudent.preflight.report import as_json as to_json
    from prudent.preflight.report import as_text, projection_check, verdict_ok
    from prudent.preflight.runner import PreflightRunner
    from prudent.wiring.config import load_settings

    settings = load_settings(config)
    price = price_for(instance, price_per_hour, spot, settings.cost.catalog_file)  # before running
    _check_inputs(device, speedup)
    runner = PreflightRunner(command or [], steps=steps, timeout_s=timeout_s, device=device,
                             keep=keep)
    if not as_json:
        typer.echo(f"prudent preflight: running {' '.join(runner.command)} in smoke mode "
                   "(smoke, overfit, stop and resume processes)...", err=True)
    result = runner.run()
    checks = run_checks(result)
    record = result.phases["smoke"].record
    projection = project(record, speedup=speedup, price=price, device=device) if record else None
    checks.append(projection_check(result, projection))
    typer.echo(to_json(result, checks, projection) if as_json else as_text(result, checks))
    raise typer.Exit(0 if verdict_ok(checks) else 1)


def _check_inputs(device: str, speedup: float | None) -> None:
    """Bad flags are refused before minutes of smoke runs, not after them."""
    import re

    from prudent.kernel.errors import ConfigError

    if speedup is not None and speedup <= 0:
        raise ConfigError(f"--speedup must be > 0, got {speedup}")
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise ConfigError(f"--device {device!r} is not a device: use cpu, cuda, cuda:N or mps")
    if device.startswith("cuda"):  # a device this machine lacks would crash every process
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: this machine has no usable CUDA GPU; "
                              "run preflight on the target machine, or leave --device at cpu")
