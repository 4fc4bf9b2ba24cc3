"""``prudent report`` and ``prudent ui`` from the command line; what the HTML carries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prudent.report.commands import host_warning
from prudent.report.pages import run_page, runs_page, verdict
from prudent.report.reader import ReadOnlyStore
from prudent.report.render import page_html, to_json
from prudent.store.database import Store
from tests.ui.conftest import XSS_NAME, free_port, project_env, prudent


def _recorded_run(home: Path | str, name: str = "digits", steps: int = 500) -> None:
    """A run as a training process records it: metrics, a rule firing, a checkpoint, the end
    (``home``: a project folder, or a database URL)."""
    url = home if isinstance(home, str) else f"sqlite:///{home / '.prudent' / 'prudent.db'}"
    store = Store(url)
    store.create_run("r1", name, config={"lr": 0.1, "note": "</script><b>x</b>"},
                     command="python train.py")
    store.add_metrics([{"run_id": "r1", "step": s, "name": "loss", "value": 1 / s, "wall": s}
                       for s in range(1, steps + 1)])
    store.add_events([
        {"run_id": "r1", "step": 100, "kind": "checkpoint", "name": "saved", "message": "ckpt",
         "payload": "{}", "wall": 100.0},
        {"run_id": "r1", "step": 400, "kind": "rule", "name": "divergence",
         "message": "loss rose 3x <b>fast</b>", "payload": "{}", "wall": 400.0}])
    store.update_run("r1", status="stopped", stop_reason="rule:divergence", step=steps,
                     ended_at=time.time())
    store.close()


def test_report_writes_one_offline_file_in_the_run_folder(tmp_path: Path) -> None:
    (tmp_path / ".prudent").mkdir()
    _recorded_run(tmp_path, name=XSS_NAME)
    result = prudent(tmp_path, "report", "r1")
    assert result.returncode == 0, result.stderr
    line, where = result.stdout.strip().splitlines()
    assert line.startswith("run r1 stopped (rule:divergence)") and "500 steps" in line
    assert where == "report: .prudent/runs/r1/report.html"
    html = (tmp_path / ".prudent" / "runs" / "r1" / "report.html").read_text()
    assert len(html.encode()) < 6e6
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)  # nothing fetched
    assert XSS_NAME not in html and "<b>fast</b>" not in html and "</script><b>" not in html
    data = json.loads(re.search(r'id="prudent-data">(.*?)</script>', html, re.S).group(1))
    assert data["run"]["name"] == XSS_NAME  # the JSON carries it intact, as text
    assert [(m["kind"], m["step"]) for m in data["markers"]] == [("checkpoint", 100),
                                                                 ("rule", 400)]
    other = tmp_path / "elsewhere" / "r.html"
    assert prudent(tmp_path, "report", "r", "-o", str(other)).returncode == 0  # a prefix
    assert other.exists()


@pytest.mark.parametrize("args", [[], ["r1", "--study", "s"]])
def test_report_needs_a_run_or_a_study(tmp_path: Path, args: list[str]) -> None:
    result = prudent(tmp_path, "report", *args)
    assert result.returncode == 2
    assert "give a RUN or --study NAME" in result.stderr


def test_report_of_an_unknown_run_or_study_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / ".prudent").mkdir()
    _recorded_run(tmp_path)
    result = prudent(tmp_path, "report", "nope")
    assert result.returncode == 2 and "no run 'nope'" in result.stderr
    result = prudent(tmp_path, "report", "--study", "nope")
    assert result.returncode == 2 and "no study 'nope'" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = prudent(empty, "report", "latest")
    assert result.returncode == 2 and "no run store at" in result.stderr


def test_json_in_the_page_cannot_close_its_script_element() -> None:
    text = to_json({"name": "</script><script>alert(1)</script>", "x": float("nan"),
                    "line": "a\u2028b"})
    assert "<" not in text and ">" not in text and "\u2028" not in text
    assert json.loads(text) == {"name": "</script><script>alert(1)</script>", "x": None,
                                "line": "a\u2028b"}
    page = page_html({"page": "runs", "runs": []}, XSS_NAME, inline=False, data_url="/api/runs")
    assert XSS_NAME not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_verdict_says_how_the_run_ended_in_one_line() -> None:
    run = {"id": "r1", "status": "completed", "stop_reason": None, "duration_s": 83.4,
           "step": 450, "restarts": 1, "metrics": {"loss": 0.066, "val_acc": 0.9667},
           "cost_usd": 0.0213}
    assert verdict(run, [{"id": "step_outliers"}]) == (
        "run r1 completed after 0:01:23, 450 steps, 1 restart; loss=0.066 val_acc=0.9667; "
        "findings: step_outliers; cost $0.02")


def test_ui_warns_when_it_listens_beyond_this_machine(tmp_path: Path) -> None:
    assert host_warning("127.0.0.1", 8765) is None
    assert "anyone who can reach this machine" in (host_warning("0.0.0.0", 8765) or "")
    (tmp_path / ".prudent").mkdir()
    _recorded_run(tmp_path)
    server = subprocess.Popen([sys.executable, "-m", "prudent", "ui", "--host", "0.0.0.0",
                               "--port", str(free_port())], cwd=tmp_path,
                              env=project_env(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        first = server.stdout.readline()
        token = re.search(r"\?token=(\S+)", first)
        assert token, first
        url = first.split()[2].replace("0.0.0.0", "127.0.0.1").split("?")[0]
        deadline = time.monotonic() + 60
        while True:  # the line is printed before the server listens
            try:
                status, _ = _fetch(url + "api/runs", host="10.1.2.3:80")  # no token
                break
            except ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert status == 401
        status, headers = _fetch(f"{url}api/runs?token={token.group(1)}", host="10.1.2.3:80")
        assert status == 200
        cookie = headers["set-cookie"].split(";")[0]
        assert _fetch(url + "api/runs", cookie=cookie)[0] == 200  # the cookie stands for it
        assert _fetch(url + "api/runs", cookie="prudent_ui_token=guess")[0] == 401
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert "prudent ui: http://0.0.0.0:" in first and "read-only" in first
    assert "warning: listening on 0.0.0.0" in err and "ssh -L" in err


def test_ui_on_loopback_refuses_a_request_for_another_host(ui: Any) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends its
    requests with its own Host; they are refused, and nothing of the store is answered."""
    status, _ = _fetch(ui.url + "/api/runs", host="evil.example:8765")
    assert status == 400
    for host in (f"127.0.0.1:{ui.port}", f"localhost:{ui.port}", "[::1]"):
        assert _fetch(ui.url + "/api/runs", host=host)[0] == 200, host


def _fetch(url: str, host: str | None = None,
           cookie: str | None = None) -> tuple[int, dict[str, str]]:
    """Status and headers of a GET (``http.client``: ``urllib`` would not send a forged
    ``Host``)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        headers = {"Host": host} if host else {}
        if cookie:
            headers["Cookie"] = cookie
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()


def test_the_pages_from_a_postgresql_store(pg_url: str) -> None:
    _recorded_run(pg_url)
    store = ReadOnlyStore(pg_url)
    try:
        page = run_page(store, "r1")
        runs = runs_page(store, [])
    finally:
        store.close()
    (loss,) = page["series"]
    assert loss["count"] == 500 and loss["steps"][:3] == [1, 2, 3]
    assert page["run"]["metrics"] == {"loss": 1 / 500}
    assert [m["kind"] for m in page["markers"]] == ["checkpoint", "rule"]
    assert [(r["id"], r["status"]) for r in runs["runs"]] == [("r1", "stopped")]


def test_a_run_from_another_machine_has_its_timeline_from_the_store(tmp_path: Path) -> None:
    # the run's folder (its profile.json) stayed on the machine that trained it: the page
    # draws throughput, utilisation and the time split from the profiler's rows in the store
    import shutil

    import torch

    import prudent
    from prudent.testing import make_settings, tiny_model

    settings = make_settings(tmp_path, profile={"interval_s": 0.02},
                             checkpoint={"enabled": False})
    run = prudent.init(name="elsewhere", settings=settings, exit_on_stop=False)
    model = tiny_model(in_features=4)
    run.attach(model=model)
    with run:
        for _ in run.steps(40):
            time.sleep(0.004)
            run.backward(model(torch.ones(8, 4)).sum())
            run.step(loss=1.0)
    shutil.rmtree(run.context.run_dir)
    store = ReadOnlyStore(f"sqlite:///{tmp_path / 'prudent.db'}")
    try:
        page = run_page(store, run.id, home=tmp_path)
        runs = runs_page(store, [])
    finally:
        store.close()
    assert [s["name"] for s in page["series"]] == ["loss"]  # the machine's series drawn apart
    assert runs["runs"][0]["metrics"] == {"loss": 1.0}
    timeline = page["timeline"]
    assert len(timeline) >= 3 and [s["t"] for s in timeline] == sorted(s["t"] for s in timeline)
    assert all({"cpu_pct", "rss_mb", "steps_per_s", "compute_pct"} <= set(s) for s in timeline)
    assert timeline[-1]["step"] == 40


def test_ui_lists_and_shows_the_studies_of_a_database_storage(tmp_path: Path) -> None:
    # machines tuning together keep their study in a database, not a journal file here
    import optuna

    from tests.ui.conftest import UiServer

    (tmp_path / ".prudent").mkdir()
    _recorded_run(tmp_path)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="shared", storage=url, direction="maximize")
    for number, lr in enumerate((0.1, 0.01, 0.5)):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1.0, log=True)})
        trial.report(0.5 + number / 10, step=1)
        study.tell(trial, 0.6 + number / 10 if number < 2 else None,
                   state=None if number < 2 else optuna.trial.TrialState.PRUNED)
    server = UiServer(tmp_path, "--storage", url)
    try:
        assert server.get_json("/api/runs")["studies"] == ["shared"]
        page = server.get_json("/api/studies/shared")
    finally:
        server.stop()
    states = [t["state"] for t in page["summary"]["trials"]]
    assert sorted(states) == ["complete", "complete", "pruned"], page["summary"]["trials"]
    assert page["params"] == ["lr"]


def test_run_pages_carry_the_basic_bundle_and_the_study_page_the_full_one() -> None:
    """The basic bundle (npm, scripts/setup.sh) is a quarter of the full one's parse time; the
    study page's parallel coordinates need the full one (the plotly Python package)."""
    import os

    from prudent.report.render import bundle_for, chart_js

    if bundle_for("run") != "plotly-basic.min.js":
        assert not os.environ.get("CI"), "npm ci --prefix src/prudent/report did not run"
        pytest.skip("the basic bundle is not installed (scripts/setup.sh runs npm ci)")
    run = page_html({"page": "run"}, "r", inline=True)
    study = page_html({"page": "study"}, "s", inline=True)
    basic = "plotly.js (basic - minified)"
    assert chart_js("plotly-basic.min.js").startswith(f"/**\n* {basic}")
    assert basic in run and basic not in study and len(run.encode()) < 1.5e6 < len(study)
    dashboard = page_html(None, "s", inline=False, data_url="/api/studies/s", page="study")
    assert 'src="/assets/plotly.min.js"' in dashboard


def test_an_iteration_loop_has_no_epoch_and_its_token_counter_is_not_a_curve(
        tmp_path: Path) -> None:
    # nanoGPT's shape: run.steps(n), no epochs, run.step(tokens=...) for tokens/s
    import prudent
    from prudent.testing import make_settings

    home = tmp_path / ".prudent"
    run = prudent.init(name="gpt", settings=make_settings(home), exit_on_stop=False)
    with run:
        for step in run.steps(5):
            run.step(loss=2.0 - step / 10, tokens=1024)
    epochs = prudent.init(name="mlp", settings=make_settings(home), exit_on_stop=False)
    with epochs:
        for _ in epochs.epochs(2):
            for _ in epochs.batches([0, 1]):
                epochs.step(loss=1.0)
    store = ReadOnlyStore(f"sqlite:///{home / 'prudent.db'}")
    page, epoch_page = run_page(store, run.id), run_page(store, epochs.id)
    runs = {r["id"]: r for r in runs_page(store, [])["runs"]}
    store.close()
    assert page["run"]["epoch"] is None and epoch_page["run"]["epoch"] is not None
    assert [s["name"] for s in page["series"]] == ["loss"]
    assert "tokens" not in page["verdict"] and "tokens" not in runs[run.id]["metrics"]
