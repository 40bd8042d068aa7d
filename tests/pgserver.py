"""A real PostgreSQL 15 server on 127.0.0.1 for the jdbc store tests (Debian package
postgresql): initdb into a temporary directory as user postgres (initdb refuses root), a
free port, the socket in that directory, trust authentication for loopback only, and a
fast shutdown at the end."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ports import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"
HOST = "127.0.0.1"


def missing_postgresql() -> str | None:
    """Why the Debian package postgresql cannot be used here, or None."""
    if not (PG_BIN / "initdb").exists():
        return f"Debian package postgresql is not installed ({PG_BIN}/initdb missing; tests/run installs it)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (the test extras have it: tests/run installs them)"
    if shutil.which("runuser") is None:
        return "runuser is missing (util-linux)"
    return None


@dataclass
class PostgreSQL:
    base: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def data(self) -> Path:
        return self.base / "data"

    def _as_postgres(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", USER, "--", *argv]

    def url(self, database: str = "postgres") -> str:
        """The JDBC URL the broker properties take (user postgres, trusted on loopback)."""
        return f"jdbc:postgresql://{HOST}:{self.port}/{database}?user={USER}"

    def conninfo(self, database: str = "postgres") -> dict[str, str]:
        return {"host": HOST, "port": str(self.port), "dbname": database, "user": USER}

    def start(self, timeout: float = 60) -> PostgreSQL:
        self.base.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.base, USER, USER)
        if not (self.data / "PG_VERSION").exists():  # else started again after a stop
            subprocess.run(
                self._as_postgres(
                    [
                        str(PG_BIN / "initdb"),
                        "-D",
                        str(self.data),
                        "-U",
                        USER,
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        "--no-instructions",
                    ]
                ),
                check=True,
                capture_output=True,
            )
        log = self.base / "postgres.log"
        self.proc = subprocess.Popen(
            self._as_postgres(
                [
                    str(PG_BIN / "postgres"),
                    "-D",
                    str(self.data),
                    "-h",
                    HOST,
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.base),
                    "-c",
                    "listen_addresses=" + HOST,
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=open(log, "wb"),  # noqa: SIM115  (the server's)
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while (
            subprocess.run(
                self._as_postgres([str(PG_BIN / "pg_isready"), "-q", "-h", HOST, "-p", str(self.port)])
            ).returncode
            != 0
        ):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"PostgreSQL did not start on port {self.port}:\n" + log.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.1)
        return self

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(**self.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def stop_fast(self, timeout: float = 60) -> None:
        """PostgreSQL's "fast" shutdown: connected clients are disconnected, open
        transactions rolled back (what a database restart does to a broker's store)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        subprocess.run(
            self._as_postgres(
                [str(PG_BIN / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", str(int(timeout))]
            ),
            check=True,
            capture_output=True,
        )
        self.proc.wait(timeout)

    def stop(self, timeout: float = 60) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # SIGTERM: PostgreSQL's "smart" shutdown, then wait
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Database:
    """One database of ``server`` (a test's own, on a server tests stop and start): what
    a test asks of a server (url, conninfo, stop_fast, start, create_database), with this
    database where a name is not given."""

    server: PostgreSQL
    name: str

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.server.proc

    def url(self, database: str = "") -> str:
        return self.server.url(database or self.name)

    def conninfo(self, database: str = "") -> dict[str, str]:
        return self.server.conninfo(database or self.name)

    def create_database(self, name: str) -> str:
        return self.server.create_database(name)

    def stop_fast(self, timeout: float = 60) -> None:
        self.server.stop_fast(timeout)

    def start(self, timeout: float = 60) -> Database:
        self.server.start(timeout)
        return self

    def drop(self) -> None:
        """Drop this database (its clients are cut)."""
        import psycopg

        with psycopg.connect(**self.server.conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
