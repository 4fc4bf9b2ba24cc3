"""A real PostgreSQL server for the tests, started once per session on loopback.

The server refuses to run as root, so as root it runs as ``nobody`` (``runuser``), on a data
folder in a fresh temporary directory, on a free port with trust authentication, fsync off.
No server binary: the tests that need one skip, except under ``CI`` where they fail (CI
installs the package, see ``.ci/run``). Each test gets an empty database of its own.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "pg_url", "postgres", "postgres_binaries"]

_DATABASES = itertools.count(1)


def postgres_binaries() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder: ``start``, ``stop``, ``database``."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.user = "nobody" if os.geteuid() == 0 else None
        # as root, in /tmp: the server's user must reach its folder, whatever TMPDIR says
        self.root = Path(tempfile.mkdtemp(prefix="prudent-pg-", dir="/tmp" if self.user else None))
        self.data = self.root / "data"
        self.port = _free_port()
        if self.user:
            shutil.chown(self.root, user=self.user)
        self._pg("initdb", "-D", str(self.data), "-U", "prudent", "--auth=trust", "-N",
                 "-E", "UTF8", "--locale=C")

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql+psycopg://prudent{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=200")
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                 "-t", "30", "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def database(self) -> str:
        """A new empty database; its URL."""
        import sqlalchemy as sa

        name = f"test_{os.getpid()}_{next(_DATABASES)}"
        engine = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        engine.dispose()
        return self.url(name)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _pg(self, program: str, *args: str) -> None:
        command = [str(self.bin_dir / program), *args]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        # pg_ctl start leaves the server running on its own: it is not this process's child
        result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL, cwd=self.root)
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{program} failed ({result.returncode}): "
                               f"{result.stdout}{result.stderr}{tail}")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL tests cannot run under CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server, stopped and deleted at the end."""
    bin_dir = postgres_binaries()
    if bin_dir is None:
        _unavailable("no initdb found (apt-get install postgresql, or put initdb on PATH)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("the driver is missing: pip install -e '.[postgres]'")
    server = PostgresServer(bin_dir)  # type: ignore[arg-type]
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop("immediate")
        except RuntimeError:
            pass  # already stopped by a test that failed halfway
        server.remove()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """An empty database on the session's server."""
    return postgres.database()
