"""A Spark standalone cluster on loopback for tests: a master and two 1-core workers started
with the installed pyspark's bin/spark-class, on free ports, their work and logs under a
temporary folder; stopped (each process by its id) at the end."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from ports import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[2]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} ended: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"port {port} did not open: {log.read_text()[-2000:]}")


@dataclass
class Cluster:
    """A running standalone cluster: ``url`` is its master (spark://127.0.0.1:PORT).
    ``java_options`` go to every JVM it starts (JAVA_TOOL_OPTIONS: the master, the
    workers, Spark's launcher and the executors the workers start),
    ``daemon_java_options`` to the master's and the workers' only (SPARK_DAEMON_JAVA_OPTS:
    not the launcher's, whose stdout spark-class reads as the command to run)."""

    base: Path
    worker_env: dict[str, str] = field(default_factory=dict)
    java_options: str = ""
    daemon_java_options: str = ""
    url: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    master_ui: int = 0

    def _spawn(
        self, name: str, cls: str, *args: str, env: dict[str, str] | None = None, preexec=None
    ) -> tuple[subprocess.Popen, Path]:
        log = self.base / f"{name}.log"
        full = dict(
            os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOG_DIR=str(self.base), SPARK_NO_DAEMONIZE="1", **(env or {})
        )
        if self.java_options:
            full["JAVA_TOOL_OPTIONS"] = self.java_options
        if self.daemon_java_options:
            full["SPARK_DAEMON_JAVA_OPTS"] = self.daemon_java_options
        command = [str(SPARK_HOME / "bin" / "spark-class"), cls, *args]
        if cls.endswith("Worker") and self.hidden_works:
            # the worker (and its executors) see an empty tmpfs over `hidden`: a folder
            # only the driver's machine has
            command = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs "{self.hidden}" && exec "$0" "$@"', *command]
        proc = subprocess.Popen(
            command,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=full,
            cwd=self.base,
            start_new_session=True,
            preexec_fn=preexec,
        )
        self.procs.append(proc)
        return proc, log

    @property
    def hidden(self) -> Path:
        """A folder the driver sees and the executors do not (see hidden_works)."""
        return self.base / "driver-only"

    @property
    def hidden_works(self) -> bool:
        """Whether this machine lets us hide ``hidden`` from the workers (a mount namespace:
        root, or unprivileged user namespaces)."""
        return (
            shutil.which("unshare") is not None
            and subprocess.run(
                ["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs "{self.hidden}"'], capture_output=True
            ).returncode
            == 0
        )

    def start(self, workers: int = 2) -> Cluster:
        self.hidden.mkdir(exist_ok=True)
        port, self.master_ui = free_port(), free_port()
        master, log = self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(self.master_ui),
        )
        _wait_port(port, master, log)
        self.url = f"spark://127.0.0.1:{port}"
        self._start_workers([f"worker{i}" for i in range(workers)])
        return self

    def _start_workers(self, names: list[str]) -> None:
        """Start a worker per name, their JVMs together, and wait until all registered."""
        started = [self._start_worker(name) for name in names]
        for proc, wport, log in started:
            _wait_port(wport, proc, log)
        self.wait_workers(self.live_workers())

    def live_workers(self) -> int:
        return sum(1 for p in self.procs[1:] if p.poll() is None)

    def restore_workers(self, n: int = 2) -> None:
        """Start workers in place of the dead ones (a test killed them) until ``n`` live."""
        base = len(self.procs)
        self._start_workers([f"worker-r{base + i}" for i in range(n - self.live_workers())])

    def start_worker(self, name: str, env: dict[str, str] | None = None, preexec=None) -> subprocess.Popen:
        proc, wport, log = self._start_worker(name, env, preexec)
        _wait_port(wport, proc, log)
        return proc

    def _start_worker(
        self, name: str, env: dict[str, str] | None = None, preexec=None
    ) -> tuple[subprocess.Popen, int, Path]:
        work = self.base / name
        work.mkdir(exist_ok=True)
        wport = free_port()
        env = {"PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT), **self.worker_env, **(env or {})}
        proc, log = self._spawn(
            name,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(wport),
            "--webui-port",
            str(free_port()),
            "--cores",
            "1",
            "--memory",
            "1g",
            "--work-dir",
            str(work),
            self.url,
            env=env,
            preexec=preexec,
        )
        return proc, wport, log

    def alive_workers(self) -> int:
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui}/json/", timeout=5) as r:
            data = json.load(r)
        return sum(1 for w in data.get("workers", []) if w.get("state") == "ALIVE")

    def wait_workers(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_workers() < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.alive_workers()} of {n} workers registered")
            time.sleep(0.5)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # its own session: the JVM and executors
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
