"""A cloud interruption notice, served by a real local HTTP server standing in for the EC2
metadata service: the run saves an emergency checkpoint, exits as resumable, is relaunched
and resumes without redoing a step."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from prudent.testing import local_http_server
from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import assert_identical, attempts, final_state


class FakeImds(BaseHTTPRequestHandler):
    """EC2 IMDSv2: a token, then 404 until `announce` is set, then one spot notice."""

    announce = threading.Event()
    served = threading.Event()

    def do_PUT(self) -> None:  # noqa: N802
        self._reply(200, "token-123") if self.path == "/latest/api/token" else self._reply(404, "")

    def do_GET(self) -> None:  # noqa: N802
        if self.path != "/latest/meta-data/spot/instance-action" or \
                self.headers.get("X-aws-ec2-metadata-token") != "token-123":
            return self._reply(404 if self.headers.get("X-aws-ec2-metadata-token") else 401, "")
        if self.announce.is_set() and not self.served.is_set():
            self.served.set()  # the relaunched process runs on a "new machine": no notice
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
            return self._reply(200, json.dumps({"action": "terminate", "time": when}))
        self._reply(404, "")

    def _reply(self, code: int, body: str) -> None:
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[str]:
    FakeImds.announce.clear()
    FakeImds.served.clear()
    with local_http_server(FakeImds) as url:
        yield url


@pytest.mark.slow
def test_spot_notice_saves_exits_resumable_and_resumes_exactly(project: Project, imds: str) -> None:
    (project.path / "prudent.yaml").write_text(
        f"preemption: {{watch: on, cloud: aws, metadata_url: '{imds}', poll_interval_s: 0.2}}\n"
        "checkpoint: {every: 1000steps}\n")  # only the emergency save can keep the work
    reference_env = dict(project.env, PRUDENT_PREEMPTION_WATCH="off")
    reference = subprocess.run(
        [sys.executable, "-m", "prudent", "run", "--run-id", "reference", "--set", "out=ref.pt",
         "--set", "log=ref.log", "--set", "workers=0", "--", sys.executable, script("resume_train.py")],
        cwd=project.path, env=reference_env, capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr

    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "spot", "--max-restarts", "1",
         "--restart-backoff-s", "0.1", "--set", "sleep_s=0.02", "--set", "workers=0", "--",
         sys.executable, script("resume_train.py")],
        cwd=project.path, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = project.path / "steps.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) >= 10):
        assert supervisor.poll() is None, supervisor.communicate()[1]
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    FakeImds.announce.set()
    _, err = supervisor.communicate(timeout=300)
    assert supervisor.returncode == 0, err
    assert "relaunch 1 of 1 after exit code 75" in err

    before, after = attempts(log)
    assert after[0] == before[-1] + 1  # no step done twice, none skipped
    assert_identical(final_state(project.path / "ref.pt"), final_state(project.path / "final.pt"))
    events = project.show("spot")["events"]
    names = [(e["kind"], e["name"]) for e in events]
    notice = names.index(("preemption", "notice"))
    assert "AWS interruption notice: spot terminate at" in events[notice]["message"]
    saved = [e for e in events[notice:] if e["name"] == "saved"]
    assert saved and saved[0]["step"] == before[-1]
    assert ("checkpoint", "resumed") in names and project.show("spot")["restarts"] == 1


def test_no_notice_means_no_stop(project: Project, imds: str) -> None:
    (project.path / "prudent.yaml").write_text(
        f"preemption: {{watch: on, cloud: aws, metadata_url: '{imds}', poll_interval_s: 0.05}}\n")
    result = project.prudent("run", "--run-id", "calm", "--set", "epochs=1", "--set", "workers=0",
                             "--", sys.executable, script("resume_train.py"))
    assert result.returncode == 0, result.stderr
    assert not [e for e in project.show("calm")["events"] if e["kind"] == "preemption"]
