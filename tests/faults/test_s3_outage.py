"""The S3 server goes away in the middle of a checkpoint upload and comes back a few seconds
later: training goes on, the cut-short checkpoint is never loaded, the next saves land, and a
preempted run resumes exactly. S3 is moto's real server on loopback; the client reaches it
through a relay this test cuts, in the middle of a checkpoint's upload: every connection
reset, new ones refused, as when the server's process or machine stops."""

from __future__ import annotations

import collections
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prudent.store.database import Store
from tests.e2e.conftest import Project, s3_bucket, script
from tests.e2e.test_resume import assert_identical, final_state
from tests.ui.conftest import free_port

NUM_STEPS = 72  # resume_train.py: 3 epochs of 24 batches
BIG_PUT = 256 * 1024  # bytes: a request this large is a checkpoint file, not a heartbeat
OUTAGE_S = 20.0


class S3Relay:
    """A TCP relay in front of the S3 server. ``cut_at_next_upload()``: the next large PUT is
    passed on in part, then every connection is reset and new ones are refused until
    ``restart()`` (the server, as its clients see it, stopped mid-upload)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.num_cut = 0
        self._armed = False
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._clients: set[socket.socket] = set()  # the S3 client's ends, not the server's

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._stop.clear()
        self._cut.clear()
        self._thread = threading.Thread(target=self._serve, name="s3-relay", daemon=True)
        self._thread.start()

    def restart(self) -> None:
        self.close()
        self.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def cut_at_next_upload(self) -> None:
        with self._lock:
            self._armed = True

    def wait_cut(self, timeout: float) -> bool:
        return self._cut.wait(timeout)

    def _serve(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        self._clients = set()
        try:
            while not self._stop.is_set() and not self._cut.is_set():
                for key, _ in sel.select(timeout=0.05):
                    sock = key.fileobj
                    if sock is listener:
                        self._accept(listener, sel, peers)
                    else:
                        self._pass_on(sock, sel, peers)  # type: ignore[arg-type]
            if self._cut.is_set():  # stopped: refuse from now on, until restarted
                sel.unregister(listener)
                listener.close()
                _reset_all(peers)
                self._stop.wait()
        finally:
            _reset_all(peers)
            sel.close()
            listener.close()

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector,
                peers: dict[socket.socket, socket.socket]) -> None:
        client, _ = listener.accept()
        server = socket.create_connection(self.target)
        for sock in (client, server):
            sock.setblocking(True)
            sel.register(sock, selectors.EVENT_READ)
        peers[client], peers[server] = server, client
        self._clients.add(client)

    def _pass_on(self, sock: socket.socket, sel: selectors.BaseSelector,
                 peers: dict[socket.socket, socket.socket]) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        other = peers.get(sock)
        if not data or other is None:
            for one in (sock, other):
                if one is not None and one in peers:
                    sel.unregister(one)
                    peers.pop(one)
                    one.close()
            return
        with self._lock:
            cut = self._armed and sock in self._clients and _is_big_put(data)
            self._armed = self._armed and not cut
        if cut:  # the headers and part of the body reach the server, the rest never does
            data = data[:len(data) // 2]
        try:
            other.sendall(data)
        except OSError:
            pass
        if cut:
            self.num_cut += 1
            self._cut.set()


def _is_big_put(data: bytes) -> bool:
    if not data.startswith(b"PUT "):
        return False
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1]) >= BIG_PUT
    return False


def _reset_all(peers: dict[socket.socket, socket.socket]) -> None:
    for sock in list(peers):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        sock.close()
    peers.clear()


def _steps_logged(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.slow
def test_an_s3_server_stopped_mid_upload_loses_no_step_and_no_row(
        tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    project = Project(tmp_path)
    project.env["PRUDENT_CONSOLE"] = "off"
    train = ["--set", "workers=0", "--set", "hidden=384", "--", sys.executable,
             script("resume_train.py")]
    done = project.prudent("run", "--run-id", "ref", "--set", "out=reference.pt", "--set",
                           "log=reference.log", *train, timeout=180)
    assert done.returncode == 0, done.stderr

    host, port = s3_endpoint.removeprefix("http://").split(":")
    relay = S3Relay((host, int(port)))
    relay.start()
    url = f"s3://{s3_bucket(s3_endpoint, monkeypatch)}/runs/s3"
    project.env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": relay.endpoint,
                        "PRUDENT_CHECKPOINT_URL": url, "PRUDENT_CHECKPOINT_EVERY": "5steps"})
    command = [sys.executable, "-m", "prudent", "run", "--run-id", "s3", "--set", "sleep_s=0.05",
               *train]
    log = tmp_path / "steps.log"
    first = subprocess.Popen(command, cwd=tmp_path, env=project.env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = ""
    try:
        deadline = time.monotonic() + 120
        while _steps_logged(log) < 12:
            assert time.monotonic() < deadline and first.poll() is None, "no progress"
            time.sleep(0.01)
        relay.cut_at_next_upload()
        assert relay.wait_cut(timeout=60), "no checkpoint was uploaded"
        cut_at = _steps_logged(log)
        time.sleep(OUTAGE_S)  # longer than the S3 client retries: the save fails
        relay.restart()  # the server is back, with what it held before it stopped
        while _steps_logged(log) < NUM_STEPS - 30:
            assert first.poll() is None, "the run ended early"
            time.sleep(0.01)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
        preempted_at = _steps_logged(log)  # the last step the first process trained
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate(timeout=60)
            relay.close()
    try:
        assert first.returncode == 75, err  # preempted, as if S3 had never gone away
        assert "Traceback" not in err, err
        second = project.prudent("run", "--run-id", "s3", "--set", "sleep_s=0", *train,
                                 timeout=180)
    finally:
        relay.close()
    assert second.returncode == 0, second.stderr
    assert_identical(final_state(tmp_path / "reference.pt"), final_state(tmp_path / "final.pt"))

    store = Store(f"sqlite:///{tmp_path / '.prudent' / 'prudent.db'}")
    try:
        run = store.get_run("s3")
        steps = [step for step, _ in store.metric_series("s3", "loss")]
        events = store.events("s3")
    finally:
        store.close()
    assert run is not None and run["status"] == "completed"
    counts = collections.Counter(steps)
    assert sorted(counts) == list(range(1, NUM_STEPS + 1))  # every step's loss
    assert max(counts.values()) == 1  # and none twice: the resume was exact
    failed = [e for e in events if e["name"] == "save_failed"]
    assert failed and all("\n" not in e["message"] for e in failed)  # one line each
    (resumed,) = [e for e in events if e["name"] == "resumed"]
    assert resumed["step"] == preempted_at  # from the stop's own checkpoint: nothing redone
    saved = [e["step"] for e in events if e["name"] == "saved"]
    print(f"S3 stopped mid-upload at step {cut_at} for {OUTAGE_S} s; failed saves: "
          f"{[(e['step'], e['message'][:120]) for e in failed]}; saved: {saved}; preempted at "
          f"{preempted_at}, resumed at {resumed['step']}")
