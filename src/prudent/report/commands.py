"""``prudent report`` (one self-contained HTML file) and ``prudent ui`` (the live dashboard)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import typer

from prudent.kernel.errors import ConfigError
from prudent.wiring.config import load_settings

__all__ = ["LOCAL_HOSTS", "access", "host_warning", "report", "ui"]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_ConfigOption = typer.Option(None, "--config", "-c", metavar="FILE",
                              help="Settings file (default ./prudent.yaml).")


def report(
    run_ref: str | None = typer.Argument(None, metavar="RUN", help="Run id, a unique "
                                         "prefix, or 'latest'."),
    study: str | None = typer.Option(None, "--study", metavar="NAME", help="A tuning study's "
                                     "report instead of a run's."),
    output: str | None = typer.Option(None, "--output", "-o", metavar="FILE", help="Where to "
                                      "write the HTML (default: report.html in the run's or "
                                      "study's folder)."),
    storage: str | None = typer.Option(None, "--storage", metavar="URL", help="The study's Optuna "
                                       "storage URL (default: its journal file under "
                                       ".prudent/studies)."),
    config: str | None = _ConfigOption,
) -> None:
    """One HTML file with a run's (or a study's) curves, events, profile and cost.

    It opens offline: its scripts and data are inside.

    Example: prudent report baseline -o report.html
    """
    from prudent.report.pages import run_page
    from prudent.report.reader import open_readonly
    from prudent.report.render import page_html
    from prudent.report.study import study_page
    from prudent.store.database import resolve_run, run_folder

    if (run_ref is None) == (study is None):
        raise typer.BadParameter("give a RUN or --study NAME (one of them)",
                                 param_hint="'RUN'")
    settings = load_settings(config)
    home = Path(settings.store.home).resolve()
    if study is not None:
        data = study_page(settings, study, storage)
        target = Path(output) if output else home / "studies" / study / "report.html"
        html = page_html(data, f"study {study}", inline=True)
        lines = [f"study {study}: " + ", ".join(f"{n} {s}" for s, n in
                                                sorted(data["summary"]["counts"].items()))]
    else:
        store = open_readonly(settings.store)
        try:
            run_id = resolve_run(store, run_ref or "")
            data = run_page(store, run_id, home)
        finally:
            store.close()
        target = Path(output) if output else run_folder(home, run_id) / "report.html"
        html = page_html(data, f"{data['run']['name']} ({run_id})", inline=True)
        lines = [data["verdict"]]
    _write(target, html)
    typer.echo("\n".join([*lines, f"report: {_shown(target)}"]))


def ui(
    port: int = typer.Option(8765, "--port", "-p", min=0, max=65535, metavar="PORT",
                      help="Port to listen on."),
    host: str = typer.Option('127.0.0.1', "--host", metavar="ADDRESS", help="Address to listen "
                             "on; anything but this machine's loopback shows the store to the "
                             "network."),
    storage: str | None = typer.Option(None, "--storage", metavar="URL", help="An Optuna storage "
                                       "URL whose studies are listed too (prudent tune --storage "
                                       "...); journal files under .prudent/studies always are."),
    allow_host: list[str] = typer.Option([], "--allow-host", metavar="NAME", help="A host "
                                         "name requests may use besides this machine's "
                                         "loopback names (repeatable): a name of this machine "
                                         "behind a tunnel or a proxy."),
    config: str | None = _ConfigOption,
) -> None:
    """A local, read-only dashboard over the store: runs, a run's curves live, compare, studies.

    Example: prudent ui --port 8765
    """
    from prudent.report.app import create_app
    from prudent.report.reader import open_readonly
    from prudent.report.render import BUNDLES, chart_js

    try:
        import uvicorn
    except ImportError:
        raise ConfigError("prudent ui needs its web server: pip install 'prudent[ui]'") from None
    settings = load_settings(config)
    studies = None
    if storage is not None:
        from prudent.tune.study import open_storage

        studies = open_storage(storage)
    store = open_readonly(settings.store)
    for bundle in BUNDLES:  # read once now, not while the first page waits
        chart_js(bundle)
    warning = host_warning(host, port)
    if warning:
        print(warning, file=sys.stderr)
    hosts, token = access(host, allow_host)
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    print(f"prudent ui: {address} over {store.url} (read-only; Ctrl-C stops it)", flush=True)
    try:
        uvicorn.run(create_app(settings, store, studies, hosts=hosts, token=token), host=host,
                    port=port, log_level="warning")
    finally:
        store.close()


def access(host: str, allowed: list[str]) -> tuple[frozenset[str] | None, str | None]:
    """The host names requests may use, and the token they must carry. On loopback: its
    names (and ``allowed``), no token. Beyond it: a token printed at start (its names are
    not known here), requests' host names checked only when ``allowed`` names some."""
    names = frozenset(name.lower() for name in allowed)
    if host in LOCAL_HOSTS:
        return frozenset(LOCAL_HOSTS) | names, None
    return (frozenset(LOCAL_HOSTS) | names | {host.lower()} if names else None,
            secrets.token_urlsafe(18))


def host_warning(host: str, port: int) -> str | None:
    """What a person must know before the dashboard listens beyond this machine."""
    if host in LOCAL_HOSTS:
        return None
    return (f"prudent ui: warning: listening on {host}:{port}, not 127.0.0.1: anyone who can "
            "reach this machine and has the address below (its token is the only login) can "
            "read every run's config, command, metrics and events, over plain HTTP. To look "
            f"from another machine, keep the default and tunnel: ssh -L {port}:127.0.0.1:{port} "
            "THIS_HOST")


def _write(target: Path, html: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_text(html, encoding="utf-8")
        temporary.replace(target)
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {target}: {exc.strerror}; choose "
                          "another place with -o FILE") from None


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path.resolve())
