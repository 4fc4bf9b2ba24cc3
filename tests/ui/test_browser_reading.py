"""How the run and compare pages read, in a real headless Chromium: each test asserts one
thing a person looking at the page would notice (a crushed column, a mess of tick labels, a
flat line drawn as a climb, an empty chart) on pages drawn from hand-made data
(:mod:`tests.ui.pagedata`), written as the self-contained report is; and that the curve tools
work on the live dashboard too."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from prudent.report.render import page_html
from tests.ui import pagedata
from tests.ui.conftest import UiServer, unavailable

try:
    import playwright  # noqa: F401
except ImportError:
    unavailable("playwright is missing: pip install -e '.[dev]'", module=True)
pytestmark = pytest.mark.slow


def _report(page: Any, folder: Path, data: dict[str, Any], width: int = 1100) -> None:
    """``data`` as the report writes it (one offline file), open and drawn."""
    path = folder / f"{data['page']}.html"
    path.write_text(page_html(data, data["page"], inline=True))
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_selector("#app[data-ready]", timeout=20_000)
    page.wait_for_selector(".curve[data-drawn]", timeout=20_000)


def _box(page: Any, selector: str) -> dict[str, float]:
    return page.locator(selector).first.bounding_box()


def _lines_of_text(page: Any, selector: str) -> list[int]:
    """How many lines the text of each matched element takes on screen."""
    return page.evaluate("""(selector) => Array.from(document.querySelectorAll(selector), (cell) => {
        const range = document.createRange();
        range.selectNodeContents(cell);
        return new Set(Array.from(range.getClientRects(), (r) => Math.round(r.top))).size;
    })""", selector)


def _tick_labels(page: Any, chart: str) -> list[str]:
    return page.locator(f"{chart} .yaxislayer-above .ytick text").all_text_contents()


def _plot_height(page: Any, chart: str) -> float:
    return float(page.evaluate("(s) => document.querySelector(s)._fullLayout._size.h", chart))


def test_events_table_keeps_step_kind_and_name_on_one_line(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page(), width=700)  # a narrow window
    assert set(_lines_of_text(page, "#events th")) == {1}
    for column in (1, 2, 3):
        assert set(_lines_of_text(page, f"#events td:nth-child({column})")) == {1}, column
    assert "stop_requested" in page.locator("#events td:nth-child(3)").all_inner_texts()
    assert max(_lines_of_text(page, "#events td:nth-child(4)")) >= 3  # the message wraps


def test_log_axis_labels_powers_of_ten_only(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page())
    labels = _tick_labels(page, '.curve[data-metric="loss"]')
    values = [float(label.replace("\u2212", "-")) for label in labels]
    assert len(values) >= 3 and all(math.log10(v).is_integer() for v in values), labels


def test_series_within_one_percent_is_drawn_flat(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page())  # memory from 450.27 to 450.80 MB
    chart = '.curve[data-metric="mem_mb"]'
    line = _box(page, f"{chart} .scatterlayer .trace path.js-line")
    assert line["height"] < 0.1 * _plot_height(page, chart)
    page.locator("#system[data-drawn]").wait_for(state="attached", timeout=10_000)
    low, high = page.evaluate("document.querySelector('#system')._fullLayout.yaxis2.range")
    assert high - low >= 0.02 * 450 and low < 450.27 and high > 450.80


def test_run_without_a_price_shows_no_flat_zero_cost_chart(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page())
    assert page.locator("#cost").count() == 0
    assert "no instance price known" in page.locator("#no-cost").inner_text()


def test_one_point_is_shown_as_a_number(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page(num_samples=1))
    acc = page.locator('.stat[data-metric="final_acc"]')
    assert "0.93" in acc.inner_text() and "step 299" in acc.inner_text()
    assert page.locator('.curve[data-metric="final_acc"]').count() == 0
    machine = page.locator("#machine").inner_text()
    assert "12.5" in machine and "95%" in machine and "450.3 MB" in machine
    assert page.locator("#throughput, #system, #split").count() == 0


def test_step_time_split_label_fits_its_chart(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page())
    page.locator("#breakdown[data-drawn]").wait_for(state="attached", timeout=10_000)
    label = _box(page, "#breakdown .ytick text")
    chart = _box(page, "#breakdown")
    assert page.locator("#breakdown .ytick text").text_content() == "step time"
    assert label["x"] >= chart["x"] and label["width"] > 40  # the whole label, inside


def test_compare_names_runs_by_name_and_short_id_on_a_log_axis(page: Any,
                                                                tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.compare_page())
    names = ["tiny (ab12)", "tiny (cd34)", "tiny (ef56)"]
    assert page.locator("#title").inner_text() == "compare " + ", ".join(names)
    loss = '.curve[data-metric="loss"]'
    assert page.locator(f"{loss} .legendtext").all_text_contents() == names
    values = [float(t.replace("\u2212", "-")) for t in _tick_labels(page, loss)]
    assert all(math.log10(v).is_integer() for v in values)  # a loss: log by default
    page.select_option("#y-scale", "linear")
    page.wait_for_function(f"""() => document.querySelector('{loss}')._fullLayout.yaxis.type
        === 'linear'""")
    assert "0" in _tick_labels(page, loss)  # a linear axis has its zero
    assert "0.93" in page.locator('.stat[data-metric="final_acc"]').inner_text()


def _smooth(page: Any, weight: float) -> None:
    page.evaluate("""(w) => { const s = document.querySelector('#smoothing');
        s.value = String(w); s.dispatchEvent(new Event('input', {bubbles: true})); }""", weight)


def test_smoothing_draws_the_ema_over_the_faint_raw_curve(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page())
    loss = '.curve[data-metric="loss"]'
    _smooth(page, 0.9)
    page.wait_for_function(f"document.querySelector('{loss}').data.length >= 3")
    traces = page.evaluate(f"""() => document.querySelector('{loss}').data
        .filter((t) => t.name === 'loss').map((t) => ({{opacity: t.opacity ?? 1, y: Array.from(t.y)}}))""")
    raw, smoothed = traces
    assert raw["opacity"] < 0.5 and smoothed["opacity"] == 1
    jumps = [sum(abs(a - b) for a, b in zip(t["y"], t["y"][1:])) for t in (raw, smoothed)]
    assert jumps[1] < 0.6 * jumps[0]  # the smoothed line is calmer than the raw one
    assert page.locator(f"{loss} .scatterlayer .trace path.js-line").count() >= 2
    _smooth(page, 0)
    page.wait_for_function(f"""() => document.querySelector('{loss}').data
        .filter((t) => t.name === 'loss').length === 1""")


def test_x_axis_switches_to_wall_time(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page())
    loss = '.curve[data-metric="loss"]'
    page.select_option("#x-axis", "wall")
    page.wait_for_function(f"document.querySelector('{loss}')._fullLayout.xaxis.type === 'date'")
    assert page.locator(f"{loss} .g-xtitle").text_content() == "wall time"
    assert any(":" in t for t in page.locator(f"{loss} .xtick text").all_text_contents())
    page.select_option("#x-axis", "step")
    page.wait_for_function(f"document.querySelector('{loss}')._fullLayout.xaxis.type === 'linear'")


def _visible_metrics(page: Any) -> list[str]:
    return page.evaluate("""() => Array.from(document.querySelectorAll('#curves [data-metric]'))
        .filter((d) => d.offsetParent !== null).map((d) => d.dataset.metric)""")


def test_metric_filter_shows_only_matching_charts(page: Any, tmp_path: Path) -> None:
    _report(page, tmp_path, pagedata.run_page())
    assert _visible_metrics(page) == ["loss", "mem_mb", "final_acc"]
    page.fill("#metric-filter", "MEM")
    assert _visible_metrics(page) == ["mem_mb"]
    page.fill("#metric-filter", "")
    assert _visible_metrics(page) == ["loss", "mem_mb", "final_acc"]


def test_curve_tools_work_on_the_live_dashboard(page: Any, ui: UiServer) -> None:
    page.goto(ui.url + "/runs/ok")
    page.wait_for_selector(".curve[data-drawn]", timeout=20_000)
    page.fill("#metric-filter", "eval")
    assert _visible_metrics(page) == ["eval_mse"]
    page.fill("#metric-filter", "")
    _smooth(page, 0.8)
    page.wait_for_function("""() => document.querySelector('.curve[data-metric="loss"]').data
        .filter((t) => t.name === 'loss').length === 2""")
    page.select_option("#x-axis", "wall")
    page.wait_for_function("""() => document.querySelector('.curve[data-metric="loss"]')
        ._fullLayout.xaxis.type === 'date'""")


def test_a_resumed_iteration_loop_shows_its_attempts_no_epoch_and_unmeasured_data(
        page: Any, tmp_path: Path) -> None:
    data = pagedata.run_page()
    data["run"]["epoch"] = None  # run.steps(n): no epochs
    data["profile"]["data_measured"] = False  # its batches come from get_batch(), not run.batches
    split = {"data_pct": 0.0, "compute_pct": 90.0, "checkpoint_pct": 5.0, "eval_pct": 0.0,
             "other_pct": 5.0}
    data["profile_attempts"] = [
        {"attempt": 1, "first_step": 0, "last_step": 120, "num_steps": 120, "wall_s": 31.0,
         **split},
        {"attempt": 2, "first_step": 120, "last_step": 300, "num_steps": 180, "wall_s": 30.0,
         **split}]
    _report(page, tmp_path, data)
    fields = page.locator("#summary dt").all_inner_texts()
    assert "steps" in fields and "epoch" not in fields
    assert "attempt 2 of 2 (steps 120–300)" in page.locator("#attempt-note").inner_text()
    assert page.locator("#attempts tbody tr").count() == 2
    assert "data not measured" in page.locator("#data-not-measured").inner_text()
