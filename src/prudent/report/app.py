"""``prudent ui``: the report's pages served live from the store, read-only.

Starlette, GET only (any other method is answered 405: nothing here writes). Each page is the
report's shell; its data comes from ``/api/...`` (the same dicts as the report), fetched while
Plotly's bundle loads. A run's page asks twice at once: ``?quick=1`` and the full page. A run
the store's rollup covers is answered whole to the first (its curves cost milliseconds; the
twin request waits for that build and takes it from the cache: one build per run at a time);
for one it does not (written before the rollup) the quick answer is everything but the
curves, so a million-point run's page opens at once, and the curves follow. A running run's
page polls its ``/api/runs/ID?since=TOKEN`` every
second: the answer is ``{"unchanged": true}`` until the run gains a metric or an event. A run's
data is cached by that token, so a finished run's downsampling runs once.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from prudent.kernel.errors import ConfigError
from prudent.report.pages import compare_page, run_page, runs_page
from prudent.report.reader import ReadOnlyStore
from prudent.report.render import BUNDLES, asset, chart_js, page_html, to_json
from prudent.report.study import list_studies, study_page
from prudent.store.database import resolve_run

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from prudent.wiring.config import ProjectSettings

__all__ = ["create_app"]

_ASSETS = {"app.js": "text/javascript", "app.css": "text/css",
           **dict.fromkeys(BUNDLES, "text/javascript")}


class _RunCache:
    """The newest pages of a few runs, each with the token it was built at, when, and how long
    it took: a running run's page is rebuilt at most every ``max(0.3 s, 4 x that time)``, so
    that watching a huge live run never takes more than a fifth of a core from its training."""

    def __init__(self, size: int = 16) -> None:
        self.pages: OrderedDict[str, tuple[str, Any, float, float]] = OrderedDict()
        self.size = size
        self.lock = threading.Lock()

    def get(self, key: str, token: str) -> Any:
        with self.lock:
            found = self.pages.get(key)
            return found[1] if found and found[0] == token else None

    def recent(self, key: str) -> Any:
        """The newest page when it is younger than its rebuild interval, else None."""
        with self.lock:
            found = self.pages.get(key)
        if found is None:
            return None
        _, page, built, cost_s = found
        return page if time.monotonic() - built < max(0.3, 4 * cost_s) else None

    def put(self, key: str, token: str, page: Any, cost_s: float = 0.0) -> None:
        with self.lock:
            self.pages[key] = (token, page, time.monotonic(), cost_s)
            self.pages.move_to_end(key)
            while len(self.pages) > self.size:
                self.pages.popitem(last=False)


class _Gate:
    """Who may read the dashboard (ASGI middleware around the app).

    A request must name, in its ``Host`` header, a host the dashboard serves: a web page
    elsewhere whose name was made to resolve to 127.0.0.1 (DNS rebinding) names its own host,
    and is refused. Listening beyond this machine, a request must also carry the token
    ``prudent ui`` printed: once in the address (``?token=``), then in a cookie it sets.
    """

    COOKIE = "prudent_ui_token"

    def __init__(self, app: Any, hosts: frozenset[str] | None, token: str | None) -> None:
        self.app, self.hosts, self.token = app, hosts, token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        host = request.headers.get("host", "")
        if self.hosts is not None and _host_name(host) not in self.hosts:
            refused = PlainTextResponse(
                f"prudent ui: refused a request for host {host!r}: this dashboard serves "
                f"{', '.join(sorted(self.hosts))}. To reach it by that name, start it with "
                f"--allow-host {_host_name(host) or 'NAME'}\n", status_code=400)
            await refused(scope, receive, send)
            return
        if self.token is None:
            await self.app(scope, receive, send)
            return
        given = request.query_params.get("token", "")
        if hmac.compare_digest(given, self.token):
            cookie = f"{self.COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"

            async def send_with_cookie(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []),
                                          (b"set-cookie", cookie.encode())]
                await send(message)

            await self.app(scope, receive, send_with_cookie)
            return
        if hmac.compare_digest(request.cookies.get(self.COOKIE, ""), self.token):
            await self.app(scope, receive, send)
            return
        refused = PlainTextResponse(
            "prudent ui: this dashboard needs its token: open the address prudent ui printed "
            "when it started (it ends in ?token=...)\n", status_code=401)
        await refused(scope, receive, send)


def _host_name(host: str) -> str:
    """``Host`` without its port: "127.0.0.1:8765" -> "127.0.0.1", "[::1]:80" -> "::1"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def create_app(settings: ProjectSettings, store: ReadOnlyStore, studies: Any = None, *,
               hosts: frozenset[str] | None = None, token: str | None = None) -> Any:
    """The dashboard's app; ``hosts``: the names a request's ``Host`` may give (any when
    None); ``token``: the one every request must carry (none when None)."""
    app = _pages(settings, store, studies)
    return app if hosts is None and token is None else _Gate(app, hosts, token)


def _pages(settings: ProjectSettings, store: ReadOnlyStore, studies: Any = None) -> Starlette:
    """The dashboard over ``store`` (opened read-only by the caller, closed by it too);
    ``studies``: an opened Optuna storage whose studies are listed beside the journal files."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, Response
    from starlette.routing import Route

    home = settings.store.home
    cache = _RunCache()
    builds: dict[str, threading.Lock] = {}  # one build of a run's page at a time
    last_values = _RunCache(size=10_000)

    def last_metrics(run_id: str) -> dict[str, float | None]:  # a scan per run: only on change
        token = store.metrics_token(run_id)
        found = last_values.get(run_id, token)
        if found is None:
            found = store.last_metrics(run_id)
            last_values.put(run_id, token, found)
        return dict(found)

    def json_response(data: Any, status: int = 200) -> Response:
        return Response(to_json(data), status_code=status, media_type="application/json",
                        headers={"Cache-Control": "no-store"})

    def shell(title: str, data_url: str, live: bool, quick_url: str | None = None,
              page: str = "run") -> Response:
        return HTMLResponse(page_html(None, title, inline=False, data_url=data_url, live=live,
                                      quick_url=quick_url, page=page), headers=_SECURITY_HEADERS)

    def runs_html(request: Request) -> Response:
        return shell("runs", "/api/runs", live=True)

    def runs_api(request: Request) -> Response:
        return json_response(runs_page(store, list_studies(home, studies),
                                       last_metrics=last_metrics))

    def run_html(request: Request) -> Response:
        url = f"/api/runs/{quote(request.path_params['run_id'], safe='')}"
        return shell(f"run {request.path_params['run_id']}", url, live=True,
                     quick_url=f"{url}?quick=1")

    def run_api(request: Request) -> Response:
        try:
            run_id = resolve_run(store, request.path_params["run_id"])
        except ConfigError as exc:
            return json_response({"error": str(exc)}, 404)
        token = store.metrics_token(run_id)
        quick = request.query_params.get("quick")
        if quick and cache.get(run_id, token) is None and not store.rollup_covers(run_id):
            return json_response(run_page(store, run_id, home, series=False))
        if request.query_params.get("since") == token:
            return json_response({"unchanged": True, "token": token})
        with builds.setdefault(run_id, threading.Lock()):  # the page and its twin request
            return json_response(run_data(run_id, token, request.query_params.get("since")))

    def run_data(run_id: str, token: str, since: str | None) -> dict[str, Any]:
        page = cache.get(run_id, token)
        if page is None or page["run"]["status"] == "running":
            page = cache.recent(run_id)  # a live run's page: rebuilt at a bounded rate
            if page is not None and page["token"] == since:
                return {"unchanged": True, "token": page["token"]}
        if page is None:
            started = time.perf_counter()
            page = run_page(store, run_id, home)
            cache.put(run_id, page["token"], page, time.perf_counter() - started)
        return page

    def compare_html(request: Request) -> Response:
        ids = request.query_params.get("ids", "")
        return shell("compare", f"/api/compare?ids={quote(ids, safe=',')}", live=False)

    def compare_api(request: Request) -> Response:
        refs = [r for r in request.query_params.get("ids", "").split(",") if r]
        try:
            ids = [resolve_run(store, r) for r in refs]
        except ConfigError as exc:
            return json_response({"error": str(exc)}, 404)
        if len(ids) < 2:
            return json_response({"error": "compare needs two or more runs: /compare?ids=A,B"},
                                 400)
        return json_response(compare_page(store, ids))

    def study_html(request: Request) -> Response:
        name = request.path_params["name"]
        return shell(f"study {name}", f"/api/studies/{quote(name, safe='')}", live=True,
                     page="study")

    def study_api(request: Request) -> Response:
        try:
            return json_response(study_page(settings, request.path_params["name"],
                                            opened=studies))
        except ConfigError as exc:
            return json_response({"error": str(exc)}, 404)

    def assets(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _ASSETS:
            return Response("not found", status_code=404)
        body = chart_js(name) if name in BUNDLES else asset(name)
        return Response(body, media_type=_ASSETS[name], headers={"Cache-Control": "max-age=3600"})

    routes = [Route("/", runs_html), Route("/api/runs", runs_api),
              Route("/runs/{run_id}", run_html), Route("/api/runs/{run_id}", run_api),
              Route("/compare", compare_html), Route("/api/compare", compare_api),
              Route("/studies/{name}", study_html), Route("/api/studies/{name}", study_api),
              Route("/assets/{name}", assets)]
    return Starlette(routes=routes)


# The pages run only our own scripts, and talk only to this server.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline' "
    "'unsafe-eval'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
