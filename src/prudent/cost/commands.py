"""The cost side of the command line: ``prudent catalog``, ``policy check``, ``cost``, and the
cost flags of ``prudent run`` (passed to the child as settings of its launch spec)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from prudent.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from prudent.config import ProjectSettings
    from prudent.store import Store

__all__ = ["bill", "breakdown", "catalog", "check_or_exit", "cost_settings", "policy_app"]

policy_app = typer.Typer(no_args_is_help=True, help="Check jobs against the cost policy.")
_ConfigOption = typer.Option(None, "--config", "-c", help="Settings file (default ./prudent.yaml).")


# prudent run -------------------------------------------------------------------------------
def cost_settings(instance: str | None, spot: bool | None, nodes: int | None,
                  budget_usd: str | None, max_hours: str | None,
                  policy: str | None) -> dict[tuple[str, str], str | None]:
    """``prudent run``'s cost flags as ``{(section, key): value}`` (None: not given), for
    ``load_settings`` here and the child's launch spec."""
    return {("cost", "instance"): instance,
            ("cost", "spot"): None if spot is None else ("1" if spot else "0"),
            ("cost", "nodes"): None if nodes is None else str(nodes),
            ("cost", "budget_usd"): budget_usd, ("cost", "max_hours"): max_hours,
            ("cost", "policy_file"): str(Path(policy).resolve()) if policy else None}


def check_or_exit(settings: ProjectSettings, kind: str = "run", parallel: int = 1) -> None:
    """Refuse a job the policy forbids: one line on stderr, exit 6, nothing written."""
    from prudent.cost.launch import check_launch
    from prudent.cost.policy import PolicyViolation

    try:
        check_launch(settings, kind=kind, parallel=parallel)
    except PolicyViolation as exc:
        print(f"prudent: error: {exc}", file=sys.stderr)
        raise typer.Exit(int(ExitCode.POLICY)) from None


def breakdown(store: Store, run_id: str) -> dict[str, Any] | None:
    """The newest cost breakdown of a run (``cost`` in ``prudent show --json``)."""
    found = None
    for event in store.events(run_id):
        if event["kind"] == "cost" and event["name"] in ("price", "meter"):
            found = dict(event["payload"])
    return found


# prudent catalog ---------------------------------------------------------------------------
def catalog(
    cloud: str | None = typer.Option(None, "--cloud", help="Only aws, gcp or azure."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    catalog_file: str | None = typer.Option(None, "--catalog-file", help="Your own price "
                                               "CSV (default: cost.catalog_file)."),
    config: str | None = _ConfigOption,
) -> None:
    """The price catalog: GPU instance types with on-demand and spot $/h."""
    from prudent.config import load_settings
    from prudent.cost.catalog import load_catalog

    settings = load_settings(config)
    rows = load_catalog(catalog_file or settings.cost.catalog_file).rows(cloud)
    if cloud and not rows:
        raise ConfigError(f"--cloud {cloud!r} has no rows: use aws, gcp, azure, or a cloud of "
                          "your own catalog file")
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    _print_catalog(rows)


def _print_catalog(rows: list[Any]) -> None:
    dates = sorted({r.prices_as_of for r in rows})
    table = Table("instance", "region", "GPUs", "vCPUs", "memory GiB", "on-demand $/h", "spot $/h",
                  title=f"list prices as of {', '.join(dates)}; override with cost.catalog_file")
    for r in rows:
        spot = f"{r.spot_usd:.3f}" if r.spot_usd is not None else ""
        table.add_row(r.ref, r.region, f"{r.num_gpus} x {r.gpu}", str(r.vcpus),
                      f"{r.memory_gib:g}", f"{r.on_demand_usd:.3f}", spot)
    Console(width=max(Console().width, 110)).print(table)


# prudent policy check ----------------------------------------------------------------------
@policy_app.command("check")
def policy_check(
    instance: str = typer.Option(..., "--instance", help="cloud:instance, e.g. aws:g5.xlarge."),
    hours: str = typer.Option(..., "--hours", help="How long the job would run: 12 or '90min'."),
    spot: bool = typer.Option(False, "--spot", help="On spot instances."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs in all (default: the "
                                       "instance's x nodes)."),
    nodes: int = typer.Option(1, "--nodes", help="Machines in the job."),
    kind: str = typer.Option("run", "--kind", help="run or tune (for require_spot)."),
    parallel: int = typer.Option(1, "--parallel", help="Trials at once (a tuning study)."),
    budget_usd: str | None = typer.Option(None, "--budget-usd", help="The job's budget."),
    policy: str | None = typer.Option(None, "--policy", help="Policy file (default: the "
                                         "policy: section of prudent.yaml)."),
    config: str | None = _ConfigOption,
) -> None:
    """Would this job be allowed? Prints the projected cost; exit 0 complies, 1 violates, 2 bad input."""
    from dataclasses import replace

    from prudent.config import load_settings
    from prudent.cost.catalog import load_catalog
    from prudent.cost.launch import existing_spend
    from prudent.cost.policy import check_job, job_from_settings, load_policy

    if kind not in ("run", "tune") or nodes < 1 or parallel < 1 or (gpus is not None and gpus < 0):
        raise ConfigError(f"--kind {kind!r} --nodes {nodes} --parallel {parallel} --gpus {gpus}: "
                          "kind is run or tune, nodes and parallel >= 1, gpus >= 0")
    overrides = cost_settings(instance, spot, nodes, budget_usd, hours, policy)
    settings = load_settings(config, overrides=overrides)
    table = load_catalog(settings.cost.catalog_file)
    job = replace(job_from_settings(settings.cost, table, kind=kind, parallel=parallel), gpus=gpus)
    broken = check_job(load_policy(settings), job, existing_spend(settings), table)
    typer.echo(f"projected cost ${job.projected_usd:.2f}: {job.hours:g} h at {job.describe()}"
               + (f" x {parallel} trials" if parallel > 1 else ""))
    for violation in broken:
        typer.echo(f"violates {violation.rule}: {violation.message}")
    typer.echo("complies with the policy" if not broken else f"{len(broken)} rule(s) broken")
    raise typer.Exit(1 if broken else 0)


# prudent cost ------------------------------------------------------------------------------
def bill(
    since: str | None = typer.Option(None, "--since", help="'7d', '12h' or a UTC date "
                                        "2026-12-01 (default: everything)."),
    by: str = typer.Option("run", "--by", help="Group by run, name, day or instance."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    config: str | None = _ConfigOption,
) -> None:
    """The bill: spent, wasted on crashes, on runs stopped early, waiting for data; saved on spot."""
    from prudent.config import load_settings
    from prudent.cost.bill import BY, since_timestamp
    from prudent.cost.bill import bill as make_bill
    from prudent.store import Store

    if by not in BY:
        raise ConfigError(f"--by {by!r} is invalid: use one of {', '.join(BY)}")
    start = since_timestamp(since)
    store = Store.open(load_settings(config).store)
    try:
        total, lines = make_bill(store, start, by)
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"since": start, "by": by, "total": total.as_dict(),
                               "groups": [line.as_dict() for line in lines]}, indent=2))
        return
    _print_bill(total, lines, by)


def _print_bill(total: Any, lines: list[Any], by: str) -> None:
    table = Table(by, "runs", "hours", "spent $", "wasted on crashes $", "stopped early $",
                  "saved by stopping early $", "waiting for data $", "saved on spot $")
    for line in [*lines, total]:
        table.add_row(line.key, str(line.runs), f"{line.hours:.3g}", f"{line.spent_usd:.2f}",
                      f"{line.wasted_crash_usd:.2f}", f"{line.stopped_early_usd:.2f}",
                      f"{line.saved_early_stop_usd:.2f}", f"{line.data_wait_usd:.2f}",
                      f"{line.saved_spot_usd:.2f}")
    Console(width=max(Console().width, 140)).print(table)
