"""See a run: a self-contained HTML report (``prudent report``) and a live local dashboard
(``prudent ui``), both read-only views of the store.

::

    reader.py      the store opened read-only (never disturbs a run writing it)
    downsample.py  metric series as min/max per step bucket: every extreme, a bounded size
    pages.py       what the runs, run and compare pages show, as JSON-able dicts
    study.py       what a tuning study's page shows (prudent study's summary, curves)
    render.py      the HTML shell; the report inlines Plotly (the basic bundle from npm, the
                   full one for a study), our script and the data
    app.py         the dashboard: Starlette, GET only, a running run's page polls
    commands.py    the report and ui commands
    assets/        the page script (draws from the JSON, strings as text only) and style

Needs ``pip install 'prudent[ui]'`` (plotly; starlette and uvicorn for the dashboard), and
from a clone ``npm ci --prefix src/prudent/report`` (scripts/setup.sh) for the basic bundle.
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = ["create_app", "open_readonly", "page_html", "run_page", "runs_page", "study_page"]

__getattr__ = lazy_exports(__name__, {
    "create_app": "prudent.report.app", "open_readonly": "prudent.report.reader",
    "page_html": "prudent.report.render", "run_page": "prudent.report.pages",
    "runs_page": "prudent.report.pages", "study_page": "prudent.report.study",
})
