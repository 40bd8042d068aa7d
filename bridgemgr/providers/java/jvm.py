"""The JVM: classpath, class loaders, thread context, error translation, clean exit.

One JVM per process, started through JPype on first use, its classpath the union of what
configure() was given, imq.bridge.java.classpath, $IMQ_BRIDGE_JAVA_CLASSPATH and the lib/ext
folders. A lookup environment with its own classpath gets an isolated class loader.
translate() and java_errors() turn Java exceptions into our JMSException tree (an
IOException in the cause chain is a TransportException: the link reconnects).

Rules: calls that load provider classes by name run under the provider's class loader as
thread context loader; the JVM owns SIGSEGV until it is gone (never faulthandler.disable()
after start()), Python keeps SIGTERM, SIGINT, SIGHUP and SIGQUIT (-Xrs, interrupt=False:
SIGNAL_OPTIONS); every Java connection registers in OPEN so close_all() can end it at exit.

Design notes: docs/architecture.md#internals-providersjavajvmpy.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...extras import require
from ...jms import errors as jms_errors
from ...jms.errors import JMSException, NamingException, TransportException, XAException
from ...transform import TRANSFORMER_PATH_PROPERTY, split_path

log = logging.getLogger(__name__)

CLASSPATH_PROPERTY = "imq.bridge.java.classpath"
CLASSPATH_ENV = "IMQ_BRIDGE_JAVA_CLASSPATH"
IMQ_HOME_ENV = "IMQ_HOME"
CLOSE_TIMEOUT = 10.0  # seconds a connection may take to close at exit
# The JVM leaves SIGTERM, SIGINT, SIGHUP and SIGQUIT to Python (serve's clean stop and
# reload): without -Xrs its own handlers replace Python's and end the process (exit 143,
# 130, 129); JPype's interrupt=False hands a SIGINT/SIGTERM that Java code sees to Python.
SIGNAL_OPTIONS = ("-Xrs",)

_lock = threading.RLock()
_configured: list[str] = []
_jvm_args: list[str] = []
_loaders: dict[tuple[str, ...], Any] = {}
_late_folder: str | None = None


# --- classpath ------------------------------------------------------------------------------


def split_classpath(text: str | Iterable[str] | None) -> list[str]:
    """Classpath entries from a string (os.pathsep or ',' separated) or an iterable."""
    if text is None:
        return []
    if isinstance(text, (str, os.PathLike)):
        parts = str(text).replace(",", os.pathsep).split(os.pathsep)
    else:
        parts = [str(p) for p in text]
    return [p.strip() for p in parts if p.strip()]


def expand(entries: Iterable[str]) -> list[str]:
    """Jars and class folders: `dir/*` and globs become the files they match, in order."""
    out: list[str] = []
    for entry in entries:
        path = os.path.expanduser(entry)
        if path.endswith(os.sep + "*") or path == "*":
            matches = sorted(glob.glob(os.path.join(os.path.dirname(path) or ".", "*.jar")))
        elif any(c in path for c in "*?["):
            matches = sorted(glob.glob(path))
        else:
            matches = [path]
        for match in matches:
            if match not in out:
                out.append(match)
    return out


def ext_folders(instance_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The IMQ_HOME-style extension folders that exist: $IMQ_HOME/lib/ext, <instance>/lib/ext."""
    folders = []
    home = os.environ.get(IMQ_HOME_ENV)
    if home:
        folders.append(Path(home) / "lib" / "ext")
    if instance_dir is not None:
        folders.append(Path(instance_dir) / "lib" / "ext")
    return [str(f / "*") for f in folders if f.is_dir()]


def configure(classpath: str | Iterable[str] | None = None, jvm_args: Iterable[str] = ()) -> None:
    """Add classpath entries (and, before the JVM starts, JVM options)."""
    entries = expand(split_classpath(classpath))
    with _lock:
        fresh = [e for e in entries if e not in _configured]
        _configured.extend(fresh)
        if is_started():
            if jvm_args:
                log.warning("the JVM is running already; options %s are ignored", list(jvm_args))
            import jpype

            for entry in fresh:
                jpype.addClassPath(os.path.abspath(entry))
        else:
            _jvm_args.extend(a for a in jvm_args if a not in _jvm_args)


def configure_from_properties(props: Any) -> None:
    """imq.bridge.java.classpath of broker properties, the jars of the plugin folders of
    imq.bridge.transformer.path, and the instance's lib/ext folder."""
    plugin_jars = [str(folder / "*") for folder in split_path(props.get(TRANSFORMER_PATH_PROPERTY))]
    configure(split_classpath(props.get(CLASSPATH_PROPERTY)) + plugin_jars + ext_folders(props.instance_dir))


def classpath() -> list[str]:
    """What the JVM starts (or started) with, besides JPype's own support jar."""
    with _lock:
        return expand(_configured + split_classpath(os.environ.get(CLASSPATH_ENV)) + ext_folders())


# --- the JVM --------------------------------------------------------------------------------


def is_started() -> bool:
    """Only JPype starts a JVM here: not imported yet, none runs (and importing it to ask
    cost every `serve` 0.18 s of CPU, numpy with it, for bridges without Java)."""
    jpype = sys.modules.get("jpype")
    return jpype is not None and bool(jpype.isJVMStarted())


def start() -> None:
    """Start the JVM unless it runs; NamingException when JPype or a JVM is missing."""
    with _lock:
        if is_started():
            return
        (jpype,) = require("the Java provider", "jpype", error=NamingException)
        global _late_folder
        late = tempfile.mkdtemp(prefix="imqbridge-jvm-")
        path = [late] + [os.path.abspath(p) for p in classpath()]
        try:
            jpype.startJVM(*jvm_options(), classpath=path, convertStrings=False, interrupt=False)
        except Exception as exc:
            shutil.rmtree(late, ignore_errors=True)
            raise NamingException(f"cannot start the JVM through JPype: {exc}") from exc
        if threading.current_thread() is not threading.main_thread():
            # The starting thread is the JVM's non-daemon "main": once it ended, JPype's
            # DestroyJavaVM at exit would wait for it forever. Its next Java call
            # attaches it again, as a daemon like any other Python thread.
            jpype.java.lang.Thread.detach()
        _late_folder = late
        atexit.register(shutil.rmtree, late, True)
        log.info("JVM started (options: %s; classpath: %s)", " ".join(jvm_options()), os.pathsep.join(path) or "empty")
        # atexit runs in reverse order: registered after JPype's own hook, ours runs first.
        atexit.register(close_all)


def jvm_options() -> list[str]:
    """The options the JVM starts with: those configure() was given, then SIGNAL_OPTIONS."""
    with _lock:
        return _jvm_args + [o for o in SIGNAL_OPTIONS if o not in _jvm_args]


def late_folder() -> str | None:
    """The folder at the head of the startup classpath for classes made after the start
    (None before the JVM runs, or when something else started it)."""
    return _late_folder


def jclass(name: str, loader: Any = None) -> Any:
    """The Java class ``name`` (from ``loader``, else JPype's own class loader)."""
    from jpype import JClass

    return JClass(name, loader=loader) if loader is not None else JClass(name)


def default_loader() -> Any:
    """JPype's class loader: the classpath plus entries added after the start."""
    start()
    import jpype

    return jpype.JClass("org.jpype.JPypeContext").getInstance().getClassLoader()


def isolated_loader(entries: Iterable[str]) -> Any:
    """A class loader of its own for ``entries`` (cached), its parent the platform loader."""
    files = tuple(os.path.abspath(p) for p in expand(entries))
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise NamingException(f"{CLASSPATH_PROPERTY}: {', '.join(missing)} does not exist")
    start()
    with _lock:
        loader = _loaders.get(files)
        if loader is None:
            import jpype

            url = jpype.JClass("java.net.URL")
            urls = jpype.JArray(url)([jpype.JClass("java.io.File")(f).toURI().toURL() for f in files])
            platform = jpype.JClass("java.lang.ClassLoader").getPlatformClassLoader()
            loader = jpype.JClass("java.net.URLClassLoader")(urls, platform)
            _loaders[files] = loader
        return loader


@contextmanager
def context_loader(loader: Any) -> Iterator[None]:
    """Run with ``loader`` as the thread's context class loader (providers load by name)."""
    import jpype

    thread = jpype.JClass("java.lang.Thread").currentThread()
    before = thread.getContextClassLoader()
    thread.setContextClassLoader(loader)
    try:
        yield
    finally:
        thread.setContextClassLoader(before)


# --- open connections and the exit ------------------------------------------------------------

OPEN: set[Any] = set()  # Java connections not closed yet (their wrappers remove them)


def track(jconn: Any) -> None:
    with _lock:
        OPEN.add(jconn)


def untrack(jconn: Any) -> None:
    with _lock:
        OPEN.discard(jconn)


def close_all(timeout: float = CLOSE_TIMEOUT) -> int:
    """Close every Java connection still open; how many would not close in time."""
    with _lock:
        pending = list(OPEN)
        OPEN.clear()
    if not pending:
        return 0
    log.info("closing %d Java connection(s) left open", len(pending))
    threads = []
    for jconn in pending:
        thread = threading.Thread(target=_quiet_close, args=(jconn,), daemon=True, name="java connection close")
        thread.start()
        threads.append(thread)
    stuck = 0
    for thread in threads:
        thread.join(timeout)
        stuck += thread.is_alive()
    if stuck:
        # DestroyJavaVM would wait for their non-daemon threads forever: let the process end.
        import jpype.config

        jpype.config.destroy_jvm = False
        log.warning("%d Java connection(s) did not close within %.0f s", stuck, timeout)
    return stuck


def _quiet_close(jconn: Any) -> None:
    try:
        jconn.close()
    except Exception as exc:
        log.debug("closing a Java connection at exit: %s", exc)


# --- Java exceptions -> ours ----------------------------------------------------------------------

# Simple names of the JMS exception classes (javax.jms and jakarta.jms alike) -> ours.
TABLE: dict[str, type[JMSException]] = {
    "IllegalStateException": jms_errors.IllegalStateException,
    "IllegalStateRuntimeException": jms_errors.IllegalStateException,
    "InvalidClientIDException": jms_errors.InvalidClientIDException,
    "InvalidDestinationException": jms_errors.InvalidDestinationException,
    "InvalidSelectorException": jms_errors.InvalidSelectorError,
    "JMSSecurityException": jms_errors.JMSSecurityException,
    "MessageEOFException": jms_errors.MessageEOFException,
    "MessageFormatException": jms_errors.MessageFormatException,
    "MessageNotReadableException": jms_errors.MessageNotReadableException,
    "MessageNotWriteableException": jms_errors.MessageNotWriteableException,
    "ResourceAllocationException": jms_errors.ResourceAllocationException,
    "TransactionInProgressException": jms_errors.TransactionInProgressException,
    "TransactionRolledBackException": jms_errors.TransactionRolledBackException,
    "NamingException": NamingException,
    "NameNotFoundException": NamingException,
    "NoInitialContextException": NamingException,
    "ConfigurationException": NamingException,
    "CommunicationException": TransportException,
}
_TRANSPORT_CAUSES = frozenset({"java.io.IOException", "java.util.concurrent.TimeoutException"})


def _hierarchy(jclass_: Any) -> list[str]:
    names = []
    while jclass_ is not None:
        names.append(str(jclass_.getName()))
        jclass_ = jclass_.getSuperclass()
    return names


def _describe(exc: Any) -> str:
    text = exc.getMessage()
    name = str(exc.getClass().getName())
    return f"{name}: {text}" if text is not None else name


def translate(exc: Any, what: str = "") -> JMSException:
    """Our exception for Java exception ``exc`` (its message names the Java class)."""
    prefix = f"{what}: " if what else ""
    names = _hierarchy(exc.getClass())
    text = prefix + _describe(exc)
    if "javax.transaction.xa.XAException" in names:
        return XAException(text, int(exc.errorCode))
    cause, seen = exc, 0
    while cause is not None and seen < 16:
        if _TRANSPORT_CAUSES & set(_hierarchy(cause.getClass())):
            return TransportException(text + (f" (cause: {_describe(cause)})" if cause is not exc else ""))
        cause, seen = cause.getCause(), seen + 1
    for name in names:
        package, _, simple = name.rpartition(".")
        if package in ("javax.jms", "jakarta.jms", "javax.naming") and simple in TABLE:
            return TABLE[simple](text)
    return JMSException(text)


@contextmanager
def java_errors(what: str = "") -> Iterator[None]:
    """Translate Java exceptions raised inside the block (see translate())."""
    try:
        yield
    except Exception as exc:
        import jpype

        if isinstance(exc, jpype.JException):
            raise translate(exc, what) from None
        raise
