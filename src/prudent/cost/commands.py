"""The cost side of the command line: ``prudent catalog``, ``policy check``, ``cost``, and the
cost flags of ``prudent run`` (passed to the child as settings of its launch spec)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from prudent.kernel.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from prudent.store.database import Store
    from prudent.wiring.config import ProjectSettings

__all__ = ["bill", "breakdown", "catalog", "catalog_app", "catalog_import", "check_or_exit",
           "cost_settings", "policy_app", "stale_prices"]

policy_app = typer.Typer(no_args_is_help=True, help="Check jobs against the cost policy.\n\n"
                         "Example: prudent policy check --instance aws:g5.xlarge --hours 12")
_ConfigOption = typer.Option(None, "--config", "-c", metavar="FILE", help="Settings file (default ./prudent.yaml).")


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


def check_or_exit(settings: ProjectSettings, kind: str = "run", parallel: int = 1,
                  command: Sequence[str] = ()) -> None:
    """Refuse a job the policy forbids: one line on stderr, exit 6, nothing written."""
    from prudent.cost.launch import check_launch
    from prudent.cost.policy import PolicyViolation

    try:
        check_launch(settings, kind=kind, parallel=parallel, command=command)
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
catalog_app = typer.Typer(help="The price catalog: list it, or import SkyPilot's prices.\n\n"
                          "Example: prudent catalog --cloud aws")


@catalog_app.callback(invoke_without_command=True)
def catalog(
    ctx: typer.Context,
    cloud: str | None = typer.Option(None, "--cloud", metavar="CLOUD", help="Only one cloud: aws, gcp, azure, "
                                        "lambda, nebius, runpod, or one of your own."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    catalog_file: str | None = typer.Option(None, "--catalog-file", metavar="FILE", help="Your own price "
                                               "CSV (default: cost.catalog_file)."),
    config: str | None = _ConfigOption,
) -> None:
    """The price catalog: GPU instance types with on-demand and spot $/h, source and date."""
    from prudent.cost.catalog import load_catalog
    from prudent.wiring.config import load_settings

    if ctx.invoked_subcommand is not None:
        return
    cost = load_settings(config).cost
    if catalog_file:
        cost = cost.model_copy(update={"catalog_file": catalog_file})
    table = load_catalog(cost)
    rows = table.rows(cloud)
    if cloud and not rows:
        clouds = ", ".join(sorted({r.cloud for r in table.rows()}))
        raise ConfigError(f"--cloud {cloud!r} has no rows: use one of {clouds}, or a cloud of "
                          "your own catalog file")
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    _print_catalog(rows, cost.stale_after_days)


def _print_catalog(rows: list[Any], stale_after_days: int) -> None:
    from prudent.cost.freshness import REFRESH, age_days

    table = Table("instance", "region", "GPUs", "vCPUs", "memory GiB", "on-demand $/h",
                  "spot $/h", "as of", "source",
                  title="list prices; override with cost.catalog_file")
    for r in rows:
        spot = f"{r.spot_usd:.3f}" if r.spot_usd is not None else "no spot"
        table.add_row(r.ref, r.region, f"{r.num_gpus} x {r.gpu}", str(r.vcpus),
                      f"{r.memory_gib:g}", f"{r.on_demand_usd:.3f}", spot, r.prices_as_of,
                      r.source)
    Console(width=max(Console().width, 180)).print(table)
    stale = sum((age_days(r.prices_as_of) or 0) > stale_after_days for r in rows)
    if stale:
        print(f"prudent: warning: {stale} price(s) older than {stale_after_days} days "
              f"(cost.stale_after_days): {REFRESH}", file=sys.stderr)


@catalog_app.command("import")
def catalog_import(
    file: Path = typer.Argument(..., help="A SkyPilot vms.csv, e.g. "
                                "~/.sky/catalogs/v7/aws/vms.csv."),
    cloud: str | None = typer.Option(None, "--cloud", metavar="CLOUD", help="Whose prices these are (default: "
                                        "the folder name, as SkyPilot lays them out)."),
    region: str | None = typer.Option(None, "--region", metavar="REGION", help="The region to price (default: "
                                         "cost.regions, else the cloud's reference region)."),
    to: str | None = typer.Option(None, "--to", metavar="FILE", help="The catalog file to write (default: "
                                     "cost.catalog_file, else prudent-prices.csv)."),
    as_of: str | None = typer.Option(None, "--as-of", metavar="YYYY-MM-DD", help="The prices' date, YYYY-MM-DD "
                                        "(default: the file's modification date)."),
    config: str | None = _ConfigOption,
) -> None:
    """Import SkyPilot's prices for one cloud into your catalog file (written atomically).

    Example: prudent catalog import ~/.sky/catalogs/v7/aws/vms.csv --to prices.csv
    """
    from prudent.cost.catalog import from_skypilot, write_rows
    from prudent.cost.skypilot import cloud_of
    from prudent.wiring.config import load_settings

    cost = load_settings(config).cost
    name = (cloud or cloud_of(file) or "").lower()
    _check_date(as_of)
    rows = from_skypilot(file, name or None, region or cost.regions.get(name), as_of)
    if not rows:
        raise ConfigError(f"{file}: no GPU instance types to import; fix: pass a SkyPilot "
                          "vms.csv that lists GPU instances")
    target = Path(to or cost.catalog_file or "prudent-prices.csv")
    new = {r.ref.lower() for r in rows}
    kept = [r for r in _existing_rows(target) if r.ref.lower() not in new]
    write_rows(kept + rows, target, f"prudent catalog: your prices, and {rows[0].cloud} prices "
               f"imported from {file} (prudent catalog import)")
    regions = ", ".join(sorted({r.region for r in rows}))
    typer.echo(f"imported {len(rows)} {rows[0].cloud} instance types ({regions}, as of "
               f"{rows[0].prices_as_of}) from {file} into {target}")
    if cost.catalog_file is None or Path(cost.catalog_file).resolve() != target.resolve():
        typer.echo(f"to price runs with them, set cost.catalog_file: {target} in prudent.yaml")


def _check_date(as_of: str | None) -> None:
    from datetime import date

    try:
        if as_of is not None:
            date.fromisoformat(as_of)
    except ValueError:
        raise ConfigError(f"--as-of {as_of!r} is not a date: write YYYY-MM-DD") from None


def _existing_rows(target: Path) -> list[Any]:
    from prudent.cost.catalog import parse_rows
    from prudent.cost.skypilot import is_skypilot

    if not target.exists():
        return []
    text = target.read_text()
    if is_skypilot(text):
        raise ConfigError(f"{target} is a SkyPilot file, which prudent reads but does not "
                          "write: import into another file with --to prices.csv")
    return parse_rows(text, str(target), source=str(target))


# prudent policy check ----------------------------------------------------------------------
@policy_app.command("check")
def policy_check(
    instance: str = typer.Option(..., "--instance", metavar="CLOUD:INSTANCE",
                                 help="cloud:instance, e.g. aws:g5.xlarge."),
    hours: str = typer.Option(..., "--hours", metavar="DURATION", help="How long the job would run: 12 or '90min'."),
    spot: bool = typer.Option(False, "--spot", help="On spot instances."),
    gpus: int | None = typer.Option(None, "--gpus", metavar="N", help="GPUs in all (default: the "
                                       "instance's x nodes)."),
    nodes: int = typer.Option(1, "--nodes", metavar="N", help="Machines in the job."),
    kind: str = typer.Option("run", "--kind", metavar="run|tune", help="run or tune (for require_spot)."),
    parallel: int = typer.Option(1, "--parallel", metavar="N", help="Trials at once (a tuning study)."),
    budget_usd: str | None = typer.Option(None, "--budget-usd", metavar="USD", help="The job's budget."),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE", help="Policy file (default: the "
                                         "policy: section of prudent.yaml)."),
    config: str | None = _ConfigOption,
) -> None:
    """Would this job be allowed? Prints the projected cost; exit 0 complies, 1 violates, 2 bad input.

    Example: prudent policy check --instance aws:g5.xlarge --hours 12 --spot
    """
    from dataclasses import replace

    from prudent.cost.catalog import load_catalog
    from prudent.cost.freshness import pricing
    from prudent.cost.launch import existing_spend
    from prudent.cost.policy import check_job, job_from_settings, load_policy
    from prudent.wiring.config import load_settings

    if kind not in ("run", "tune") or nodes < 1 or parallel < 1 or (gpus is not None and gpus < 0):
        raise ConfigError(f"--kind {kind!r} --nodes {nodes} --parallel {parallel} --gpus {gpus}: "
                          "kind is run or tune, nodes and parallel >= 1, gpus >= 0")
    overrides = cost_settings(instance, spot, nodes, budget_usd, hours, policy)
    settings = load_settings(config, overrides=overrides)
    table = load_catalog(settings.cost)
    job = replace(job_from_settings(settings.cost, table, kind=kind, parallel=parallel), gpus=gpus)
    stale = pricing(job, settings.cost.stale_after_days)["stale"]
    if stale:
        print(f"prudent: warning: {stale}", file=sys.stderr)
    broken = check_job(load_policy(settings), job, existing_spend(settings), table)
    typer.echo(f"projected cost ${job.projected_usd:.2f}: {job.hours:g} h at {job.describe()}"
               + (f" x {parallel} trials" if parallel > 1 else ""))
    for violation in broken:
        typer.echo(f"violates {violation.rule}: {violation.message}")
    typer.echo("complies with the policy" if not broken else f"{len(broken)} rule(s) broken")
    raise typer.Exit(1 if broken else 0)


# prudent cost ------------------------------------------------------------------------------
def bill(
    since: str | None = typer.Option(None, "--since", metavar="WHEN", help="'7d', '12h' or a UTC date "
                                        "2026-12-01 (default: everything)."),
    by: str = typer.Option("run", "--by", metavar="run|name|day|instance", help="Group by run, name, day or instance."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    config: str | None = _ConfigOption,
) -> None:
    """The bill: spent, wasted on crashes, on runs stopped early, waiting for data; saved on spot.

    Example: prudent cost --since 7d --by name
    """
    from prudent.cost.bill import BY, since_timestamp
    from prudent.cost.bill import bill as make_bill
    from prudent.store.database import Store
    from prudent.wiring.config import load_settings

    if by not in BY:
        raise ConfigError(f"--by {by!r} is invalid: use one of {', '.join(BY)}")
    start = since_timestamp(since)
    settings = load_settings(config)
    store = Store.open(settings.store)
    try:
        total, lines = make_bill(store, start, by)
        stale = stale_prices(store, start, settings.cost.stale_after_days)
    finally:
        store.close()
    if stale:
        print(f"prudent: warning: {_stale_text(stale, settings.cost.stale_after_days)}",
              file=sys.stderr)
    if as_json:
        typer.echo(json.dumps({"since": start, "by": by, "total": total.as_dict(),
                               "groups": [line.as_dict() for line in lines],
                               "stale_prices": stale}, indent=2))
        return
    _print_bill(total, lines, by)


def stale_prices(store: Store, start: float, max_age_days: int) -> list[dict[str, Any]]:
    """The prices older than ``max_age_days`` that priced runs started since ``start``
    (from each run's ``cost/price`` event), one entry per instance."""
    from datetime import datetime, timezone

    from prudent.cost.freshness import age_days

    found: dict[str, dict[str, Any]] = {}
    for run in store.list_runs():
        if run["started_at"] < start:
            continue
        for event in store.events(run["id"]):
            price = event["payload"]
            if (event["kind"], event["name"]) != ("cost", "price") or not price.get("instance"):
                continue
            then = datetime.fromtimestamp(run["started_at"], timezone.utc).date()
            age = age_days(price.get("prices_as_of"), today=then)  # as old as when it ran
            if age is not None and age > max_age_days and price.get("source") != "cost.hourly_usd":
                found.setdefault(price["instance"], {
                    "instance": price["instance"], "prices_as_of": price["prices_as_of"],
                    "source": price.get("source") or "the catalog", "age_days": age, "runs": 0})
                found[price["instance"]]["runs"] += 1
                break
    return list(found.values())


def _stale_text(stale: list[dict[str, Any]], max_age_days: int) -> str:
    from prudent.cost.freshness import REFRESH

    named = "; ".join(f"{s['instance']} as of {s['prices_as_of']} (source {s['source']}, "
                      f"{s['runs']} run{'s' * (s['runs'] != 1)})" for s in stale)
    return (f"runs were priced at prices older than {max_age_days} days "
            f"(cost.stale_after_days): {named}; {REFRESH}")


def _print_bill(total: Any, lines: list[Any], by: str) -> None:
    table = Table(by, "runs", "attempts", "hours", "spent $", "wasted on crashes $", "stopped early $",
                  "saved by stopping early $", "waiting for data $", "saved on spot $")
    for line in [*lines, total]:
        table.add_row(line.key, str(line.runs), str(line.attempts), f"{line.hours:.3g}", f"{line.spent_usd:.2f}",
                      f"{line.wasted_crash_usd:.2f}", f"{line.stopped_early_usd:.2f}",
                      f"{line.saved_early_stop_usd:.2f}", f"{line.data_wait_usd:.2f}",
                      f"{line.saved_spot_usd:.2f}")
    Console(width=max(Console().width, 140)).print(table)
