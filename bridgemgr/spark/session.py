"""The SparkSession of imqbridge's Spark jobs, configured from the broker properties.

Every Spark job of ours (a runner=spark link, drain, the dmq commands) gets its SparkSession
from spark_session(): imq.bridge.spark.master and imq.bridge.spark.conf.* over our DEFAULTS,
the workers on this interpreter with bridgemgr and sitepath/ on their PYTHONPATH, our
daemon module (daemon.py), the plugin folders shipped (ship_plugins()), the JVM's output
into a rotating log (jvmlog.py). probe_master() tells an unreachable master in one line.

Rule: the JVM starts the Python workers, so the interpreter (PYSPARK_PYTHON), the
PYTHONPATH that holds bridgemgr and the daemon module are set before the JVM starts.

Design notes: docs/spark.md#internals-sparksessionpy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..extras import require

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ..props import BrokerProperties
    from .jvmlog import SparkLog

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
DEFAULTS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    # The driver JVM plans, checkpoints and passes rows of 8 bytes (log offsets): C2, the
    # optimising JIT, spent ~9 s of CPU compiling during a 100k-message drain (27.7 s of JVM
    # CPU in all, 8.6 s without it), taken from the Python workers that do the real work.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    # executors' Python workers fork with pyspark's worker and the bridge imported (daemon.py)
    "spark.python.daemon.module": "bridgemgr.spark.daemon",
}
_HERE = Path(__file__).resolve().parent
_PACKAGE = _HERE.parent
_PACKAGE_ROOT = str(_PACKAGE.parent)
_SITE_PATH = str(_HERE / "sitepath")  # sitecustomize.py
SPARK_PART = "Spark (runner=spark links, drain, the dmq jobs)"  # what needs imqbridge[spark]


class SparkUnavailable(RuntimeError):
    """pyspark (with pyarrow) is not installed, or no JVM could be started."""


class MasterUnreachable(SparkUnavailable):
    """The Spark master's host:port does not accept a connection (a link retries)."""


PROBE_TIMEOUT = 3.0  # s: a master that does not answer a TCP connect in this time is down


def probe_master(master: str, timeout: float = PROBE_TIMEOUT) -> None:
    """MasterUnreachable ("cannot reach spark://host:port: connection refused") when no
    host:port of a spark:// (or k8s://) master accepts a TCP connection within ``timeout``:
    Spark itself retries registering for a minute and then gives up without a word, and
    a SparkSession is never silently local instead. Other masters (local, yarn) pass."""
    import socket
    from urllib.parse import urlsplit

    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
    elif master.startswith("k8s://"):
        url = urlsplit(
            master[len("k8s://") :] if "://" in master[len("k8s://") :] else "https://" + master[len("k8s://") :]
        )
        hosts = [f"{url.hostname}:{url.port or (80 if url.scheme == 'http' else 443)}"]
    else:
        return
    why = ""
    for hostport in hosts:
        host, _, port = hostport.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            why = text[:1].lower() + text[1:]
    raise MasterUnreachable(f"cannot reach {master}: {why}")


def spark_settings(props: BrokerProperties | None) -> tuple[str, dict[str, str]]:
    """The master URL and SparkConf entries that ``props`` ask for (defaults applied)."""
    conf = dict(DEFAULTS)
    master = DEFAULT_MASTER
    if props is not None:
        master = props.get("imq.bridge.spark.master") or DEFAULT_MASTER
        conf.update(props.spark_conf)
    return master, conf


@contextlib.contextmanager
def _output_to(output: SparkLog | None) -> Iterator[None]:
    """fds 1 and 2 are the write end of a pipe into ``output``'s file meanwhile
    (jvmlog.py), when a JVM is to start (none runs yet); nothing changes otherwise.
    (pyspark reads the gateway's port from a file it names in the JVM's environment, not
    from the JVM's stdout.) Our own prints meanwhile (serve's status lines, from other
    threads) go to a copy of the old fd 1: sys.stdout is a stream over it for that time."""
    from pyspark import SparkContext

    if output is None or SparkContext._gateway is not None:
        yield
        return
    from .jvmlog import open_jvm_log

    pipe = open_jvm_log(output)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    prints = sys.stdout
    try:
        with contextlib.ExitStack() as meanwhile:
            if _on_fd(prints, 1):
                sys.stdout = meanwhile.enter_context(
                    open(saved[0], "w", encoding=prints.encoding, errors=prints.errors, closefd=False, buffering=1)
                )
                meanwhile.callback(setattr, sys, "stdout", prints)
            os.dup2(pipe.write_fd, 1)
            os.dup2(pipe.write_fd, 2)
            yield
    finally:
        for fd, copy in enumerate(saved, 1):
            os.dup2(copy, fd)
            os.close(copy)
        pipe.started()


def _on_fd(stream: IO[str], fd: int) -> bool:
    """Whether ``stream`` writes to descriptor ``fd`` (not a test's capture, say)."""
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        return False


def compile_package() -> None:
    """Write bridgemgr's bytecode where it is missing or stale (as pip does on install:
    it writes whatever PYTHONDONTWRITEBYTECODE says). Where it cannot (a read-only tree)
    the processes compile in memory, only slower."""
    import compileall

    compileall.compile_dir(_PACKAGE, quiet=2)


def prepare_python_environment() -> None:
    """Make Spark's Python workers run this interpreter and find bridgemgr compiled."""
    compile_package()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    ours = [p for p in (_PACKAGE_ROOT, _SITE_PATH) if p not in paths]
    if ours:
        os.environ["PYTHONPATH"] = os.pathsep.join([*ours, *paths])


def spark_session(
    props: BrokerProperties | None = None,
    *,
    app_name: str = "imqbridge",
    master: str | None = None,
    conf: Mapping[str, Any] | None = None,
    jvm_output: SparkLog | None = None,
) -> SparkSession:
    """The (process-wide) SparkSession: getOrCreate, so a second call returns the first
    session and its settings. ``master``/``conf`` override the properties (tests, drain).
    With ``jvm_output`` the JVM's stdout and stderr (Spark's start-up lines, log4j's WARNs,
    its Python workers' output, System.out prints) go to that file (0600, rolling over:
    jvmlog.py) instead of the service's: the JVM inherits both while it starts, so fds 1
    and 2 are a pipe into that file for that time (the service's console handler writes to
    a descriptor of its own: logfiles.Console)."""
    # pyarrow too: Python data sources fail obscurely without it
    require(SPARK_PART, "pyspark", "pyarrow", error=SparkUnavailable)
    from pyspark.sql import SparkSession

    prop_master, settings = spark_settings(props)
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    prepare_python_environment()
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:  # (getOrCreate returns that one)
        probe_master(master or prop_master)
    builder = SparkSession.builder.appName(app_name).master(master or prop_master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with _output_to(jvm_output):
            session = builder.getOrCreate()
    except Exception as exc:  # no java, a bad conf value, a port in use ...
        raise SparkUnavailable(f"cannot start Spark ({master or prop_master}): {exc}") from exc
    session.sparkContext.setLogLevel("WARN")
    return session


def executor_count(spark: SparkSession) -> int:
    """The executors registered with ``spark`` (0 on a cluster that has none for it; a
    local master runs its tasks in the driver and has none either)."""
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


# what ship_plugins gave this process's SparkContext (by application id): the name Spark
# knows a file by -> (the path it came from, its mtime)
_shipped: dict[tuple[str, str], tuple[str, float]] = {}


def ship_plugins(spark: SparkSession, folders: Iterable[str | os.PathLike[str]]) -> list[str]:
    """addPyFile every module (*.py), archive (*.zip, *.egg) and package (a folder with
    __init__.py, zipped) in ``folders``, so that the executors import the transformers the
    service loads from there; the files shipped. Spark knows a file by its name and
    refuses a second one of that name from another path, so a module in two folders is
    shipped once, from the first folder (the one the service's import finds), and a file
    already shipped unchanged is not shipped again."""
    import shutil
    import tempfile

    from ..private import private_dir

    app = spark.sparkContext.applicationId
    shipped = []
    seen: set[str] = set()  # modules and file names found in a folder before
    for folder in (Path(f) for f in folders):
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):  # a package "x" before a module "x.py", as import
            if entry.is_dir() and (entry / "__init__.py").is_file():
                module, name = entry.name, f"{entry.name}.zip"
            elif entry.suffix in (".py", ".zip", ".egg") and entry.is_file():
                module, name = (entry.stem if entry.suffix == ".py" else ""), entry.name
            else:
                continue
            if name in seen or module in seen:
                log.info("plugin %s is not shipped to Spark: %s was found before it", entry, module or name)
                continue
            seen |= {name} | ({module} if module else set())
            if entry.is_dir():
                staging = Path(tempfile.gettempdir()) / f"imqbridge-plugins-{os.getpid()}"
                private_dir(staging)
                path = shutil.make_archive(str(staging / entry.name), "zip", folder, entry.name)
                mtime = max(p.stat().st_mtime for p in entry.rglob("*"))
            else:
                path, mtime = str(entry), entry.stat().st_mtime
            before = _shipped.get((app, name))
            if before == (str(entry), mtime):
                continue
            if before is not None and before[0] != str(entry):
                log.warning(
                    "plugin %s is not shipped to Spark: its session has %s from %s (restart the service to change it)",
                    entry,
                    name,
                    before[0],
                )
                continue
            spark.sparkContext.addPyFile(path)
            _shipped[(app, name)] = (str(entry), mtime)
            shipped.append(path)
    return shipped
