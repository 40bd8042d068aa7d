"""Real ActiveMQ Classic, RabbitMQ and PostgreSQL servers on 127.0.0.1, free ports and
temporary directories, for tests/real and benchmarks/providers.py (docs/architecture.md).

ActiveMQ runs as `java -jar activemq.jar start xbean:file:<dir>/conf/activemq.xml` with
activemq.base/conf/data pointing at the temporary directory (the packaged wrapper switches
user and fails there), with OpenWire and STOMP connectors and KahaDB persistence in that
directory. RabbitMQ runs as user rabbitmq (its data must belong to it) with its node name,
ports, Erlang distribution and epmd on loopback, and the STOMP and Shovel plugins.
PostgreSQL 15 runs as user postgres (initdb refuses root) on a data directory of its own,
TCP on loopback only, its socket in that directory, SCRAM passwords over TCP, and a test
user owning a test database.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (ports.py), for benchmarks too
from ports import free_port

HOST = "127.0.0.1"
ACTIVEMQ_JAR = Path("/usr/share/activemq/bin/activemq.jar")
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
JAVA_LIB = Path("/usr/share/java")
# What a JMS client of ActiveMQ needs (and slf4j-nop to keep it quiet).
ACTIVEMQ_CLIENT_JARS = [
    str(JAVA_LIB / j)
    for j in (
        "activemq-client.jar",
        "geronimo-jms_1.1_spec.jar",
        "geronimo-j2ee-management-1.1-spec.jar",
        "hawtbuf.jar",
        "slf4j-api.jar",
        "slf4j-nop.jar",
    )
]
JMS_API_JAR = str(JAVA_LIB / "geronimo-jms_1.1_spec.jar")
ACTIVEMQ_JNDI = "org.apache.activemq.jndi.ActiveMQInitialContextFactory"


def missing_package(name: str) -> str | None:
    """Why the Debian package ``name`` cannot be used here, or None."""
    needs = {
        "activemq": [ACTIVEMQ_JAR, *map(Path, ACTIVEMQ_CLIENT_JARS)],
        "rabbitmq-server": [RABBITMQ_BIN / "rabbitmq-server"],
        "postgresql": [PG_BIN / "initdb", PG_BIN / "postgres", PG_BIN / "pg_isready"],
    }[name]
    absent = [str(p) for p in needs if not p.exists()]
    if absent:
        return f"Debian package {name} is not installed ({', '.join(absent)} missing; tests/run installs it)"
    if name == "postgresql":  # no Java; the tests talk to it through psycopg
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return "psycopg is not installed (pip install 'psycopg[binary]>=3.1'; tests/run installs it)"
        if os.geteuid() == 0 and shutil.which("runuser") is None:
            return "runuser is missing (util-linux): initdb must run as user postgres"
        return None
    if shutil.which("java") is None:
        return "no java on PATH (Debian package default-jre-headless)"
    return None


def wait_port(
    port: int, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None, since: int = 0
) -> None:
    """Until ``port`` accepts; an error with the tail of ``log`` when ``proc`` ended, or its
    log from offset ``since`` (this start's lines) says a port was taken, or on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        if log is not None and _logged_since(log, since, b"Address already in use"):
            break  # (ActiveMQ's JVM stays up when a connector cannot bind)
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"port {port} did not open within {timeout} s\n{tail}")


def _logged_since(log: Path, since: int, text: bytes) -> bool:
    try:
        with log.open("rb") as f:
            f.seek(since)
            return text in f.read()
    except FileNotFoundError:
        return False


ACTIVEMQ_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  {beans}
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="{name}"
          dataDirectory="{data}" schedulerSupport="false">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="openwire" uri="tcp://{host}:{openwire}"/>
      <transportConnector name="stomp" uri="stomp://{host}:{stomp}"/>
    </transportConnectors>
    {extra}
  </broker>
</beans>
"""


@dataclass
class ActiveMQ:
    """One ActiveMQ Classic broker; ``extra`` is XML put inside <broker>, ``beans`` before it
    (both may use {url}: the broker's own OpenWire URL)."""

    base: Path
    name: str = "test"
    extra: str = ""
    beans: str = ""
    openwire_port: int = field(default_factory=free_port)
    stomp_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"tcp://{HOST}:{self.openwire_port}"

    def jndi(self, **extra: str) -> dict[str, str]:
        """A JNDI environment for the Java provider (its own class loader of the client jars)."""
        return {
            "java.naming.factory.initial": ACTIVEMQ_JNDI,
            "java.naming.provider.url": self.url,
            "imq.bridge.java.classpath": os.pathsep.join(ACTIVEMQ_CLIENT_JARS),
            **extra,
        }

    def stomp_env(self) -> dict[str, str]:
        return {
            "java.naming.factory.initial": "imq.stomp",
            "java.naming.provider.url": f"stomp://{HOST}:{self.stomp_port}",
        }

    def start(self, timeout: float = 90) -> ActiveMQ:
        conf, data = self.base / "conf", self.base / "data"
        conf.mkdir(parents=True, exist_ok=True)
        data.mkdir(exist_ok=True)
        (conf / "activemq.xml").write_text(
            ACTIVEMQ_XML.format(
                name=self.name,
                data=data,
                host=HOST,
                openwire=self.openwire_port,
                stomp=self.stomp_port,
                extra=self.extra.replace("{url}", self.url),
                beans=self.beans.replace("{url}", self.url),
            )
        )
        log = self.base / "activemq.log"
        since = log.stat().st_size if log.exists() else 0  # (a restart appends to it)
        self.proc = subprocess.Popen(
            [
                "java",
                "-Xmx512m",
                f"-Dactivemq.base={self.base}",
                f"-Dactivemq.conf={conf}",
                f"-Dactivemq.data={data}",
                "-Dactivemq.home=/usr/share/activemq",
                "-jar",
                str(ACTIVEMQ_JAR),
                "start",
                f"xbean:file:{conf / 'activemq.xml'}",
            ],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_port(self.openwire_port, timeout, self.proc, log, since)
            wait_port(self.stomp_port, timeout, self.proc, log, since)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 60) -> None:
        """A clean shutdown (SIGTERM runs the broker's shutdown hook); SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


RABBITMQ_CONF = """listeners.tcp.1 = {host}:{amqp}
stomp.listeners.tcp.1 = {host}:{stomp}
stomp.default_vhost = /
loopback_users = none
log.console = false
"""


@dataclass
class RabbitMQ:
    """One RabbitMQ node with the STOMP and Shovel plugins, run as user rabbitmq."""

    base: Path
    amqp_port: int = field(default_factory=free_port)
    stomp_port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    epmd_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def node(self) -> str:
        return f"imqtest{self.amqp_port}@localhost"

    def stomp_env(self) -> dict[str, str]:
        return {
            "java.naming.factory.initial": "imq.stomp",
            "java.naming.provider.url": f"stomp://{HOST}:{self.stomp_port}",
            "java.naming.security.principal": "guest",
            "java.naming.security.credentials": "guest",
        }

    def amqp_env(self) -> dict[str, str]:
        """A JNDI environment for the AMQP 0-9-1 provider (imq.amqp)."""
        return {
            "java.naming.factory.initial": "imq.amqp",
            "java.naming.provider.url": f"amqp://guest:guest@{HOST}:{self.amqp_port}/%2F",
        }

    def environ(self) -> dict[str, str]:
        b = self.base
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(b),
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(b / "mnesia"),
            "RABBITMQ_LOG_BASE": str(b / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(b / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(b / "rabbitmq.conf"),
            "RABBITMQ_PID_FILE": str(b / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": HOST,
        }

    def _as_rabbitmq(self, argv: list[str]) -> list[str]:
        env = [f"{k}={v}" for k, v in self.environ().items()]
        prefix = ["runuser", "-u", "rabbitmq", "--"] if os.geteuid() == 0 else []
        return [*prefix, "env", "-i", *env, *argv]

    def start(self, timeout: float = 90) -> RabbitMQ:
        b = self.base
        for sub in ("mnesia", "log"):
            (b / sub).mkdir(parents=True, exist_ok=True)
        (b / "rabbitmq.conf").write_text(RABBITMQ_CONF.format(host=HOST, amqp=self.amqp_port, stomp=self.stomp_port))
        (b / "enabled_plugins").write_text("[rabbitmq_stomp,rabbitmq_shovel].\n")
        if os.geteuid() == 0:
            shutil.chown(b, "rabbitmq", "rabbitmq")
            for path in b.rglob("*"):
                shutil.chown(path, "rabbitmq", "rabbitmq")
        log = b / "server.log"
        self.proc = subprocess.Popen(
            self._as_rabbitmq([str(RABBITMQ_BIN / "rabbitmq-server")]),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_port(self.amqp_port, timeout, self.proc, log)
            wait_port(self.stomp_port, timeout, self.proc, log)
        except BaseException:
            self.stop()
            raise
        return self

    def ctl(self, *args: str, timeout: float = 60) -> str:
        """rabbitmqctl against this node (as user rabbitmq); its output."""
        done = subprocess.run(
            self._as_rabbitmq([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, *args]),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def stop(self, timeout: float = 60) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        epmd = shutil.which("epmd") or next(iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None)
        if epmd is not None:
            subprocess.run(
                [str(epmd), "-port", str(self.epmd_port), "-kill"],
                capture_output=True,
                env={**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)},
                timeout=10,
            )


@dataclass
class PostgreSQL:
    """One PostgreSQL 15 server of the Debian package, run as user postgres in ``base``:
    TCP on 127.0.0.1 only, the Unix socket in ``base`` (not /run/postgresql), fsync on (the
    default), password (SCRAM) authentication over TCP, and ``user`` owning ``database``,
    created at start. initdb runs through runuser; the server itself is started as user
    postgres directly (Popen user=), not under runuser: runuser answers SIGTERM by killing
    its child with SIGKILL two seconds later, so the server could never shut down cleanly."""

    base: Path
    user: str = "imqtest"
    database: str = "imqtest"
    password: str = field(default_factory=lambda: secrets.token_hex(12), repr=False)
    port: int = field(default_factory=free_port)
    superuser_password: str = field(default_factory=lambda: secrets.token_hex(12), repr=False)
    proc: subprocess.Popen | None = None

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def log(self) -> Path:
        return self.base / "postgres.log"

    def conninfo(self, database: str | None = None, superuser: bool = False) -> dict[str, str]:
        """psycopg.connect keyword arguments: the test user (or postgres) over TCP."""
        user, password = ("postgres", self.superuser_password) if superuser else (self.user, self.password)
        return {
            "host": HOST,
            "port": str(self.port),
            "dbname": database or self.database,
            "user": user,
            "password": password,
        }

    def url(self, database: str | None = None) -> str:
        """The JDBC URL broker properties take (imq.persist.jdbc.postgresql.property.url)."""
        return (
            f"jdbc:postgresql://{HOST}:{self.port}/{database or self.database}"
            f"?user={self.user}&password={self.password}"
        )

    def _as_postgres(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def start(self, timeout: float = 60) -> PostgreSQL:
        self.base.mkdir(parents=True, exist_ok=True)
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.superuser_password + "\n")
        if os.geteuid() == 0:
            for path in (self.base, pwfile):
                shutil.chown(path, "postgres", "postgres")
        done = subprocess.run(
            self._as_postgres(
                [
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    f"--pwfile={pwfile}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-instructions",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout}{done.stderr}")
        as_postgres = {"user": "postgres", "group": "postgres", "extra_groups": []} if os.geteuid() == 0 else {}
        # -h: listen_addresses, loopback only; -k: the socket beside the data, private.
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
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
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.base,
                **as_postgres,
            )
        try:
            self._wait_ready(timeout)
            self._create_user_and_database()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (
            subprocess.run(
                [str(PG_BIN / "pg_isready"), "-q", "-h", HOST, "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            ).returncode
            != 0
        ):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL did not start on {HOST}:{self.port} within "
                    f"{timeout} s:\n" + self.log.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.1)

    def _create_user_and_database(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(**self.conninfo("postgres", superuser=True), autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(self.user), sql.Literal(self.password)
                )
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(self.database), sql.Identifier(self.user))
            )

    def stop(self, timeout: float = 60) -> None:
        """Fast shutdown (SIGINT: sessions are ended, then a checkpoint); immediate
        shutdown (SIGQUIT), then SIGKILL, only if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGINT, signal.SIGQUIT):
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
