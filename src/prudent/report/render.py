"""The HTML of every page: one shell, the page's data as JSON, the script that draws it.

The report inlines everything (a Plotly bundle, our script and style, the data): one file
that opens offline. Which bundle: the runs, run and compare pages draw lines, markers and bars
only, with Plotly's basic partial bundle (1.2 MB, npm's ``plotly.js-basic-dist-min``, put under
``node_modules/`` here by ``npm ci`` in scripts/setup.sh: a quarter of the parse time of the
full one); the study page's parallel coordinates need the full bundle (4.8 MB) that the
``plotly`` Python package ships. Without the basic one (npm was not run) every page takes the
full one: slower to open, the same pages. The dashboard links the same
assets from its own server. User strings never become markup here: the data travels as JSON
inside a ``<script type="application/json">`` element with ``<``, ``>`` and ``&`` written as
``\\u003c``..., and the page's script puts every string into the page with ``textContent``.
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from prudent.kernel.errors import ConfigError

__all__ = ["asset", "bundle_for", "chart_js", "page_html", "plotly_js", "to_json"]

BASIC_BUNDLE = ("node_modules", "plotly.js-basic-dist-min", "plotly-basic.min.js")
BUNDLES = {"plotly-basic.min.js", "plotly.min.js"}  # the names the dashboard serves them by

_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                       "\u2028": "\\u2028", "\u2029": "\\u2029"})


def to_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element; NaN and infinities become null."""
    return json.dumps(_finite(data), separators=(",", ":"), default=str).translate(_SAFE)


def page_html(data: dict[str, Any] | None, title: str, *, inline: bool,
              data_url: str | None = None, live: bool = False,
              quick_url: str | None = None, page: str | None = None) -> str:
    """A whole page. ``inline``: the report (assets and data in the file); else the dashboard's
    page, which links its assets and fetches its data from ``data_url`` (and polls it when
    ``live``). With ``quick_url`` the page is drawn first from that quicker answer (a run
    without its curves) while the full one is computed: both requests leave at once, before
    Plotly's bundle loads. ``page``: which page (``data["page"]`` when the data is given),
    for the bundle it needs."""
    bundle = bundle_for(page or (data or {}).get("page", "study"))
    blob = "" if data is None else to_json(data)
    fetch = ""
    if data_url is not None:
        first = quick_url or data_url
        fetch = (f"<script>window.prudentFetch=fetch({json.dumps(first)}).then(r=>r.json());"
                 + (f"window.prudentFull=fetch({json.dumps(data_url)}).then(r=>r.json());"
                    if quick_url else "") + "</script>")
    # Plotly is parsed off the main thread (see app.js): the page's text shows first.
    if inline:
        assets = (f"<style>{asset('app.css')}</style>"
                  f'<script type="text/plain" id="plotly-src">{_script_safe(chart_js(bundle))}'
                  f"</script><script>{_script_safe(asset('app.js'))}</script>")
    else:
        assets = ('<link rel="stylesheet" href="/assets/app.css">'
                  f'<script id="plotly-js" src="/assets/{bundle}" async></script>'
                  '<script src="/assets/app.js"></script>')
    settings = to_json({"links": not inline, "live": live, "data_url": data_url})
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{html.escape(title)}</title>{fetch}</head><body>"
            f'<header><a class="brand" href="{"/" if not inline else "#"}">prudent</a>'
            f'<span id="title"></span></header><main id="app"><p class="loading">loading…</p>'
            f"</main>"
            f'<script type="application/json" id="prudent-settings">{settings}</script>'
            f'<script type="application/json" id="prudent-data">{blob}</script>'
            f"{assets}</body></html>")


def asset(name: str) -> str:
    """Our own script or style, from the package."""
    return resources.files("prudent.report").joinpath("assets", name).read_text("utf-8")


def bundle_for(page: str) -> str:
    """The Plotly bundle a page needs: the basic one where installed, except for a study."""
    if page != "study" and _basic_bundle() is not None:
        return "plotly-basic.min.js"
    return "plotly.min.js"


def chart_js(bundle: str) -> str:
    """The text of a bundle named by :func:`bundle_for`."""
    if bundle == "plotly-basic.min.js":
        found = _basic_bundle()
        if found is not None:
            return found
    return plotly_js()


@cache
def _basic_bundle() -> str | None:
    path = resources.files("prudent.report").joinpath(*BASIC_BUNDLE)
    return path.read_text("utf-8") if path.is_file() else None


@cache
def plotly_js() -> str:
    """Plotly's bundle as the ``plotly`` package installed it (never a CDN, never a copy),
    read from the package's data without importing plotly (a second of imports)."""
    spec = importlib.util.find_spec("plotly")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        bundle = Path(folder) / "package_data" / "plotly.min.js"
        if bundle.is_file():
            return bundle.read_text("utf-8")
    raise ConfigError("prudent report and prudent ui draw with plotly: "
                      "pip install 'prudent[ui]'")


def _script_safe(code: str) -> str:
    return code.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
