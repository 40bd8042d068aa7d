"""HA cluster instances for end-to-end tests: `serve` processes sharing one database of the
real PostgreSQL server (tests/pgserver.py), one central cluster properties file, and a
plain `serve` (file store) as the broker the bridges' links move messages on."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from pathlib import Path

from service_support import Daemon, cli

PASSWORD = "Ha-Secret-7"
HEARTBEAT, MONITOR = 1, 3  # seconds: imq.cluster.heartbeat.interval, imq.cluster.monitor.interval


class Instance(Daemon):
    """A serve process whose output is read on after start-up (a long run cannot fill the
    pipe), kept in ``lines``."""

    def __init__(self, props: Path, passfile: Path, brokerid: str) -> None:
        super().__init__(props)
        self.passfile, self.brokerid = passfile, brokerid
        self.seen: list[tuple[float, str]] = []  # (time.monotonic(), line) read after start-up
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            self.seen.append((time.monotonic(), line.rstrip()))

    def when(self, text: str) -> float | None:
        """When a line holding ``text`` was read (after start-up), or None."""
        return next((t for t, line in self.seen if text in line), None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)
        self._reader.join(10)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)

    def cli_list(self) -> str:
        """`list bridge` as printed."""
        r = cli(self, self.passfile, "list", "bridge", timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def listed(self) -> dict[str, dict[str, str]]:
        """`list bridge --json` on this instance: name -> row (state, owner)."""
        r = cli(self, self.passfile, "list", "bridge", "--json", timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        return {row["name"]: row for row in json.loads(r.stdout)["data"]["bridges"]}


def link_xml(name: str, m_address: str, source: str, target: str, transacted: bool = True) -> str:
    """JMS bridge ``name``: one link moving queue ``source`` to ``target`` on broker M
    (each side through its own connection factory: two resource managers)."""
    factories = "".join(
        f"""
  <connection-factory ref-name="{ref}" username="admin" password="{PASSWORD}">
    <property name="imqAddressList" value="mq://{m_address}"/>
  </connection-factory>"""
        for ref in ("msrc", "mdst")
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="{name}">
  <link name="l1" transacted="{str(transacted).lower()}">
    <source connection-factory-ref="msrc" destination-ref="src"/>
    <target connection-factory-ref="mdst" destination-ref="dst"/>
  </link>{factories}
  <destination ref-name="src" name="{source}"/>
  <destination ref-name="dst" name="{target}"/>
</jmsbridge>
"""


def host_xml(name: str) -> str:
    """JMS bridge ``name``: one link between two queues of the host broker."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="{name}">
  <link name="l1">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  <destination ref-name="src" name="{name}.in"/>
  <destination ref-name="dst" name="{name}.out"/>
</jmsbridge>
"""


class Cluster:
    """The files of one HA cluster under ``base``: a database of its own, the central
    properties (``bridges``: name -> XML) and one properties file per instance."""

    def __init__(self, base: Path, postgresql, bridges: dict[str, str], *central: str) -> None:
        self.base, self.postgresql = base, postgresql
        self.database = postgresql.create_database("ha" + uuid.uuid4().hex[:10])
        self.clusterid = "c" + uuid.uuid4().hex[:8]
        base.mkdir(parents=True, exist_ok=True)
        self.central = base / "cluster.properties"
        lines = ["imq.bridge.enabled=true", *central]
        for name, xml in bridges.items():
            (base / f"{name}.xml").write_text(xml)
            lines += [f"imq.bridge.{name}.type=jms", f"imq.bridge.{name}.xmlurl={name}.xml"]
        self.central.write_text("\n".join(lines) + "\n")
        self.instances: list[Instance] = []

    def files(self, brokerid: str, activelist: str, *extra: str, home: str = "") -> tuple[Path, Path]:
        """``home``: the instance's folder (another process of the same broker id needs its
        own), else named after the broker id."""
        d = self.base / (home or brokerid)
        d.mkdir(exist_ok=True)
        props = d / "broker.properties"
        props.write_text(
            "\n".join(
                [
                    f"imq.varhome={d / 'var'}",
                    f"imq.instancename={home or brokerid}",
                    "imq.portmapper.port=0",
                    "imq.cluster.ha=true",
                    f"imq.cluster.clusterid={self.clusterid}",
                    f"imq.brokerid={brokerid}",
                    f"imq.cluster.url=file:{self.central}",
                    f"imq.cluster.heartbeat.interval={HEARTBEAT}",
                    f"imq.cluster.monitor.interval={MONITOR}",
                    "imq.persist.store=jdbc",
                    f"imq.persist.jdbc.postgresql.property.url={self.postgresql.url(self.database)}",
                    "imq.bridge.admin.user=admin",
                    f"imq.bridge.admin.password={PASSWORD}",
                    f"imq.bridge.activelist={activelist}",
                    *extra,
                ]
            )
            + "\n"
        )
        passfile = d / "pw.properties"
        passfile.write_text(f"imq.imqbridgemgr.password={PASSWORD}\n")
        for secret in (props, passfile):  # they hold passwords: 0600, as the CLI expects
            secret.chmod(0o600)
        return props, passfile

    def start(self, brokerid: str, activelist: str, *extra: str, home: str = "") -> Instance:
        props, passfile = self.files(brokerid, activelist, *extra, home=home)
        instance = Instance(props, passfile, brokerid)
        self.instances.append(instance)
        return instance

    def stop(self) -> None:
        for instance in self.instances:
            instance.stop()


def check(props: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """`imqbridgemgr check -props PROPS` as a process."""
    import os
    import sys

    from service_support import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "bridgemgr.cli", "check", "-props", str(props)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
