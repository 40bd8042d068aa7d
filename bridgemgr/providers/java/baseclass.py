"""The original's Java MessageTransformer base class: compiled at first need, cached.

A Java transformer written for the original product extends its abstract class
com.sun.messaging.bridge.service.MessageTransformer (in newer releases
com.sun.messaging.bridge.api.MessageTransformer). We ship our own source of that class
(src/, written against jakarta.jms) and compile it when a transformer needs it: load_class()
loads the transformer's class; when the JVM reports the base class missing
(NoClassDefFoundError naming it) install() provides it and the class is loaded again.

install() compiles the source under both package names for the JMS API the transformer was
built against (jakarta.jms or javax.jms: the one its class file names, else the one its
class loader has; javax.jms by substituting the package), with the running JVM's javac (else
javac on PATH) and --release of the running JVM, once per source, API and release into the
cache folder ($XDG_CACHE_HOME or ~/.cache, then imqbridge/java). The classes then go where
the transformer's loader finds them: into jvm.late_folder() (the head of the startup
classpath, so lib/ext jars see them) when the system class loader has that JMS API, else
onto JPype's dynamic class loader. A JVM holds one base class: a later transformer built for
the other API is refused with a clear error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ...jms.errors import JMSException
from . import jvm
from .convert import API_PACKAGES

BASE_CLASSES = (
    "com.sun.messaging.bridge.service.MessageTransformer",
    "com.sun.messaging.bridge.api.MessageTransformer",
)
SOURCE = Path(__file__).parent / "src" / "com" / "sun" / "messaging" / "bridge" / "service" / "MessageTransformer.java"
WRITTEN_FOR = "jakarta.jms"  # the JMS API package SOURCE names
JAVAC_TIMEOUT = 300.0

_lock = threading.Lock()
_installed: str | None = None  # the JMS API package of the base class this JVM has


def load_class(class_name: str, loader: Any) -> Any:
    """The Java class ``class_name``; the base class is provided first if it needs it."""
    try:
        return jvm.jclass(class_name, loader)
    except Exception as exc:
        if not any(name in str(exc).replace("/", ".") for name in BASE_CLASSES):
            raise
    install(api_of(class_name, loader), loader)
    return jvm.jclass(class_name, loader)


def api_of(class_name: str, loader: Any) -> str:
    """The JMS API package a class was built against: the one its class file names (only
    one), else the one ``loader`` has (jakarta.jms first)."""
    stream = loader.getResourceAsStream(class_name.replace(".", "/") + ".class")
    data = b""
    if stream is not None:
        try:
            data = bytes(stream.readAllBytes())
        finally:
            stream.close()
    named = [api for api in API_PACKAGES if api.replace(".", "/").encode() + b"/" in data]
    if len(named) == 1:
        return named[0]
    for api in sorted(API_PACKAGES, key=lambda a: a != "jakarta.jms"):
        if _has(api, loader):
            return api
    raise JMSException(
        f"{class_name} extends MessageTransformer, but neither jakarta.jms nor "
        "javax.jms is on the JVM classpath (add the JMS API jar to lib/ext)"
    )


def _has(api: str, loader: Any) -> bool:
    try:
        jvm.jclass(f"{api}.Message", loader)
    except Exception:
        return False
    return True


def install(api: str, loader: Any) -> None:
    """Make the base class for ``api`` visible to ``loader``, compiling it unless cached."""
    global _installed
    with _lock:
        if _installed is not None:
            if _installed != api:
                raise JMSException(
                    f"this process's MessageTransformer base class was built for {_installed}; "
                    f"a transformer built against {api} cannot run beside it (one JMS API per process)"
                )
            return
        classes = _compiled(api, loader)
        system = jvm.jclass("java.lang.ClassLoader").getSystemClassLoader()
        late = jvm.late_folder()
        if late is not None and _has(api, system):
            shutil.copytree(classes, late, dirs_exist_ok=True)
        else:
            jvm.configure([str(classes)])
        _installed = api


def _release() -> str:
    """The running JVM's version as javac --release takes it (1.8 -> 8)."""
    spec = str(jvm.jclass("java.lang.System").getProperty("java.specification.version"))
    return spec[2:] if spec.startswith("1.") else spec


def _javac() -> str:
    home = Path(str(jvm.jclass("java.lang.System").getProperty("java.home")))
    own = home / "bin" / "javac"
    found = str(own) if own.exists() else shutil.which("javac")
    if found is None:
        raise JMSException(
            f"a Java transformer extends MessageTransformer; compiling its base class "
            f"needs javac (a JDK, such as Debian's default-jdk-headless), found neither "
            f"in {home / 'bin'} nor on PATH"
        )
    return found


def _api_location(api: str, loader: Any) -> str:
    """Where ``loader`` finds the JMS API (javac's classpath for the base class): the jar or
    folder its Message class comes from, else the whole classpath."""
    resource = f"{api.replace('.', '/')}/Message.class"
    url = str(loader.getResource(resource))
    if url.startswith("jar:file:") and "!/" in url:
        return unquote(url[len("jar:file:") : url.index("!/")])
    if url.startswith("file:") and url.endswith(resource):
        return unquote(url[len("file:") : -len(resource)])
    return os.pathsep.join(jvm.classpath())


def cache_root() -> Path:
    """$XDG_CACHE_HOME/imqbridge/java, else ~/.cache/imqbridge/java."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imqbridge" / "java"


def sources(api: str) -> dict[str, str]:
    """The base class source under both package names, for ``api``, by relative path."""
    text = SOURCE.read_text(encoding="utf-8")
    if api != WRITTEN_FOR:
        text = text.replace(f"{WRITTEN_FOR}.", f"{api}.")
    out = {}
    for name in BASE_CLASSES:
        package, _, simple = name.rpartition(".")
        out[f"{package.replace('.', '/')}/{simple}.java"] = text.replace(
            "package com.sun.messaging.bridge.service;", f"package {package};"
        )
    return out


def _compiled(api: str, loader: Any) -> Path:
    """The folder of the compiled base classes for ``api`` (compiled unless cached)."""
    files = sources(api)
    release = _release()
    key = hashlib.sha256("\0".join([api, release, *files.values()]).encode()).hexdigest()[:16]
    try:
        root = cache_root()
        folder = root / f"{api}-{release}-{key}"
        if folder.is_dir():
            return folder
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="compile-", dir=root))
    except (OSError, RuntimeError):  # no home, no writable cache: this process compiles for itself
        work = Path(tempfile.mkdtemp(prefix="imqbridge-java-"))
        folder = work / "classes"
    try:
        for path, text in files.items():
            (work / "src" / path).parent.mkdir(parents=True, exist_ok=True)
            (work / "src" / path).write_text(text, encoding="utf-8")
        out = work / "classes"
        command = [
            _javac(),
            "--release",
            release,
            "-nowarn",
            "-cp",
            _api_location(api, loader),
            "-d",
            str(out),
            *(str(work / "src" / p) for p in files),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=JAVAC_TIMEOUT)
        if done.returncode != 0:
            raise JMSException(
                f"compiling the MessageTransformer base class for {api} failed: "
                f"{' '.join(command)}: {(done.stderr or done.stdout).strip()[-2000:]}"
            )
        if out != folder:
            try:
                out.rename(folder)  # atomic: another process may have won the race
            except OSError:
                if not folder.is_dir():
                    raise
    finally:
        if work != folder.parent:
            shutil.rmtree(work, ignore_errors=True)
    return folder
