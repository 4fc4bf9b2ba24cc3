"""The dashboard and the report as a person sees them, in a real headless Chromium.

Real runs of a real training script (``runs_home``), a real ``prudent ui`` server, a real
``prudent tune`` study. Charts are SVG drawn by Plotly: the tests read what is drawn (paths,
hover labels) and the chart's own data.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from prudent.report.reader import ReadOnlyStore
from tests.e2e.conftest import script
from tests.ui.conftest import (
    XSS_NAME,
    XSS_NOTE,
    UiServer,
    prudent,
    start_run,
    unavailable,
)

try:
    import playwright  # noqa: F401
except ImportError:
    unavailable("playwright is missing: pip install -e '.[dev]'", module=True)
pytestmark = pytest.mark.slow

SPACE = """
lr:        {type: float, low: 1.0e-4, high: 1.0e3, log: true}
hidden:    {type: int, low: 4, high: 64, log: true}
optimizer: {type: categorical, choices: [adam, sgd]}
momentum:  {type: float, low: 0.5, high: 0.99, when: {optimizer: sgd}}
"""
SICK = '{"lr": 1000, "optimizer": "sgd", "momentum": 0.9}'  # NaN within an epoch: a rule prunes
GOOD = '{"lr": 0.05, "hidden": 32, "optimizer": "adam"}'
WEAK = '{"lr": 0.0001, "hidden": 4, "optimizer": "sgd", "momentum": 0.5}'  # the pruner prunes


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#app[data-ready]", timeout=20_000)
    kind = page.get_attribute("#app", "data-page")
    if kind in ("run", "compare"):
        page.wait_for_selector(".curve[data-drawn]", timeout=20_000)
    elif kind == "study":  # Plotly loads lazily: the charts are drawn after data-ready
        page.wait_for_selector("#history[data-drawn]", timeout=20_000)
        page.wait_for_selector("#intermediate[data-drawn]", timeout=20_000)


def _shoot(page: Any, folder: Path, name: str) -> None:
    page.wait_for_timeout(300)  # the last chart's transition
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def _rule_event(home: Path, run_id: str) -> dict[str, Any]:
    store = ReadOnlyStore(f"sqlite:///{home / '.prudent' / 'prudent.db'}")
    try:
        (event,) = [e for e in store.events(run_id) if e["kind"] == "rule"]
    finally:
        store.close()
    return event


def _traces(page: Any, metric: str) -> list[dict[str, Any]]:
    return page.evaluate("""(metric) => document.querySelector(`.curve[data-metric="${metric}"]`)
        .data.map((t) => ({name: t.name, x: Array.from(t.x), hovertext: t.hovertext || null}))""",
                         metric)


def test_runs_table_lists_every_run_with_its_status(page: Any, ui: UiServer,
                                                    screenshots: Path) -> None:
    _open(page, ui.url + "/")
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 4
    shown = {rows.nth(i).get_attribute("data-id"): rows.nth(i).locator(".status").inner_text()
             for i in range(4)}
    assert shown == {"ok": "completed", "nan": "stopped", "crash": "failed", "xss": "completed"}
    assert "rule:non_finite" in page.locator("#runs tr[data-id=nan]").inner_text()
    _shoot(page, screenshots, "runs")
    page.fill("#runs-filter", "cras")
    assert page.locator("#runs tbody tr").count() == 1
    page.fill("#runs-filter", "")
    page.select_option("#runs-status", "completed")
    assert page.locator("#runs tbody tr").count() == 2
    page.select_option("#runs-status", "")
    page.click("#runs th[data-key=step]")  # ascending: the runs that stopped early come first
    assert page.locator("#runs tbody tr").first.get_attribute("data-id") == "crash"
    page.check("#runs tr[data-id=ok] input[type=checkbox]")
    page.check("#runs tr[data-id=nan] input[type=checkbox]")
    page.click("#compare")
    page.wait_for_selector("#app[data-page=compare]")
    assert page.locator(".curve").count() >= 1 and "ids=" in page.url


def test_run_page_draws_the_loss_curve_with_the_rule_firing_on_it(
        page: Any, ui: UiServer, runs_home: Path, screenshots: Path) -> None:
    rule = _rule_event(runs_home, "nan")
    _open(page, ui.url + "/runs/nan")
    line = page.locator('.curve[data-metric="loss"] .scatterlayer .trace path.js-line').first
    assert len(line.get_attribute("d") or "") > 200  # a drawn curve, not an empty chart
    markers = {t["name"]: t for t in _traces(page, "loss")}
    assert markers["rule"]["x"] == [rule["step"]]
    assert rule["message"] in markers["rule"]["hovertext"][0].replace("<br>", " ")
    # hover the marker: the label a person reads carries the rule's message
    rule_trace = list(markers).index("rule")
    point = page.locator('.curve[data-metric="loss"] .scatterlayer .trace').nth(
        rule_trace).locator("path.point").first
    box = point.bounding_box()  # Plotly's drag layer takes the pointer: move there
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    label = page.locator('.curve[data-metric="loss"] .hoverlayer .hovertext')
    label.wait_for(timeout=5000)
    assert f"rule at step {rule['step']}" in label.text_content()
    assert "loss is NaN" in label.text_content()
    assert "rule:non_finite" in page.locator("#verdict").inner_text()
    assert page.locator("#events tr[data-kind=rule]").count() == 1
    # where the time went, over the run: one stacked trace per category the profiler split;
    # a run this short usually has one profiler sample (every 5 s), shown as its numbers
    page.locator("#split .scatterlayer .trace, #machine").first.wait_for(state="attached",
                                                                          timeout=10_000)
    if page.locator("#machine").count():
        shown = page.locator("#machine dt").all_inner_texts()
        assert {"data_pct", "compute_pct", "checkpoint_pct", "eval_pct", "other_pct"} <= set(shown)
    else:
        assert page.locator("#split .scatterlayer .trace").count() == 5
    _shoot(page, screenshots, "run")


def test_xss_run_name_and_config_show_as_text(page: Any, ui: UiServer, runs_home: Path,
                                              tmp_path: Path, screenshots: Path) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    _open(page, ui.url + "/")
    assert XSS_NAME in page.locator("#runs tr[data-id=xss] td a").inner_text()
    _open(page, ui.url + "/runs/xss")
    assert XSS_NAME in page.locator("#title").inner_text()
    assert XSS_NOTE in page.locator("#config").inner_text()
    assert page.locator("img").count() == 0 and page.locator("main script").count() == 0
    _shoot(page, screenshots, "run-xss")
    result = prudent(runs_home, "report", "xss", "-o", str(tmp_path / "xss.html"))
    assert result.returncode == 0, result.stderr
    _open(page, (tmp_path / "xss.html").as_uri())
    assert XSS_NAME in page.locator("#title").inner_text()
    assert dialogs == []


def test_report_opens_offline_with_its_curves_and_markers(page: Any, runs_home: Path,
                                                          tmp_path: Path) -> None:
    result = prudent(runs_home, "report", "nan")
    assert result.returncode == 0, result.stderr
    verdict, where = result.stdout.strip().splitlines()
    assert verdict.startswith("run nan stopped (rule:non_finite)")
    path = runs_home / where.removeprefix("report: ")
    assert path == runs_home / ".prudent" / "runs" / "nan" / "report.html"
    assert path.stat().st_size < 6e6
    requests: list[str] = []
    page.route("**/*", lambda route: (requests.append(route.request.url), route.abort())
               if not route.request.url.startswith(("file:", "blob:", "data:"))
               else route.continue_())
    _open(page, path.as_uri())
    assert requests == []  # nothing fetched from anywhere: scripts and data are in the file
    assert len(page.locator('.curve[data-metric="loss"] path.js-line').first.get_attribute("d")) \
        > 200
    assert "rule" in {t["name"] for t in _traces(page, "loss")}


def test_compare_overlays_curves_and_highlights_config_differences(
        page: Any, ui: UiServer, screenshots: Path) -> None:
    _open(page, ui.url + "/compare?ids=ok,nan")
    assert {t["name"] for t in _traces(page, "loss")} == {"ui-train (ok)", "ui-train (nan)"}
    differing = page.locator("#config tr.diff td:first-child").all_inner_texts()
    assert differing == ["nan_at"]
    chart = page.locator('.curve[data-metric="loss"]')
    legend, title = chart.locator(".legend").bounding_box(), chart.locator(".xtitle").bounding_box()
    assert legend and title and title["y"] + title["height"] <= legend["y"], (title, legend)
    _shoot(page, screenshots, "compare")


@pytest.fixture(scope="module")
def study_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``prudent tune`` study: one trial pruned by a rule, one by the pruner."""
    home = tmp_path_factory.mktemp("ui-study")
    (home / "space.yaml").write_text(SPACE)
    result = prudent(home, "tune", "--space", "space.yaml", "--objective", "val_acc", "--study",
                     "s", "--trials", "3", "--workers", "2", "--pruner", "asha", "--max-epochs",
                     "4", "--enqueue", SICK, "--enqueue", GOOD, "--enqueue", WEAK, "--",
                     sys.executable, script("tune_train.py"), timeout=300)
    assert result.returncode == 0, result.stderr
    return home


def test_study_page_shows_pruned_trials_and_who_pruned_them(
        page: Any, study_home: Path, screenshots: Path) -> None:
    server = UiServer(study_home)
    try:
        _open(page, server.url + "/")
        page.click("#studies a")
        page.wait_for_selector("#app[data-page=study]")
        page.wait_for_selector("#intermediate[data-drawn]", timeout=20_000)
        page.wait_for_selector("#history[data-drawn]", timeout=20_000)
        pruned = page.locator("#trials tr[data-state=pruned]")
        assert pruned.count() == 2
        by = set(pruned.locator(".pruned-by").all_inner_texts())
        assert "pruner" in by and by - {"pruner"} <= {"rule:non_finite", "rule:divergence"}
        names = page.evaluate("Array.from(document.querySelector('#intermediate').data, "
                              "(t) => t.name)")
        assert "trial 2 (pruned by pruner)" in names
        assert len(page.locator("#history path.point").all()) >= 2
        _shoot(page, screenshots, "study")
    finally:
        server.stop()
    result = prudent(study_home, "report", "--study", "s")
    assert result.returncode == 0, result.stderr
    _open(page, (study_home / ".prudent" / "studies" / "s" / "report.html").as_uri())
    assert page.locator("#trials tr[data-state=pruned]").count() == 2


def test_live_run_page_gains_points_while_the_run_writes(page: Any, tmp_path: Path,
                                                          screenshots: Path) -> None:
    """A real run writes the SQLite store while the page polls it and a client hammers the
    API: the page shows each new point within 2 s, and nobody sees "database is locked"."""
    training = start_run(tmp_path, "live", "--set", "steps=100000", "--set", "sleep_s=0.05")
    db = tmp_path / ".prudent" / "prudent.db"
    server: UiServer | None = None
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 90
        while not _has_metrics(db) and time.monotonic() < deadline:
            time.sleep(0.2)
        server = UiServer(tmp_path)
        hammer = threading.Thread(target=_hammer, args=(server.url + "/api/runs/live", stop))
        hammer.start()
        _open(page, server.url + "/runs/live")
        lags = [_lag_of_next_point(page, db) for _ in range(5)]
        print(f"store-to-page lag of new points: {', '.join(f'{s:.2f} s' for s in lags)}")
        assert max(lags) < 2.0, lags
        assert int(page.locator('.curve[data-metric="loss"]').get_attribute("data-points")) > 20
        _shoot(page, screenshots, "run-live")
    finally:
        stop.set()
        training.terminate()
        _, err = training.communicate(timeout=60)
        errors = server.stop() if server else ""
    assert "database is locked" not in err + errors
    hammer.join()


def _has_metrics(db: Path) -> bool:
    if not db.exists():
        return False
    store = ReadOnlyStore(f"sqlite:///{db}")
    try:
        return store.count_metrics("live") > 0
    finally:
        store.close()


def _newest_step(db: Path) -> int:
    store = ReadOnlyStore(f"sqlite:///{db}")
    try:
        return max((s for s, _ in store.metric_series("live", "loss")), default=0)
    finally:
        store.close()


def _lag_of_next_point(page: Any, db: Path) -> float:
    """Seconds from a point being in the store to the page drawing it."""
    step = _newest_step(db)
    seen = time.monotonic()
    page.wait_for_function(
        """(step) => Number(document.querySelector('.curve[data-metric="loss"]')
            ?.dataset.lastStep || 0) >= step""", arg=step, timeout=10_000)
    lag = time.monotonic() - seen
    time.sleep(0.3)
    return lag


def _hammer(url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        with urllib.request.urlopen(url, timeout=10) as response:
            json.loads(response.read())
        time.sleep(0.05)


def test_the_server_refuses_every_write(ui: UiServer) -> None:
    for method, path in (("POST", "/api/runs"), ("PUT", "/runs/ok"), ("DELETE", "/api/runs/ok")):
        request = urllib.request.Request(ui.url + path, data=b"{}", method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        refused.value.close()
        assert refused.value.code == 405
