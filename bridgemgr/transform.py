"""MessageTransformer: the plugin API for link targets, DMQs and the STOMP bridge.

A plugin subclasses :class:`MessageTransformer` and writes ``transform``; it returns
the message to send (the one given, changed, or a new one) or None, which the
caller treats as a transform failure. During a call the plugin may use the helpers
``create_message``, ``create_queue``, ``create_topic`` and, on a JMS bridge link,
``branch_to`` (send somewhere else) and ``no_transfer`` (consume, do not send). The
caller resets both before every call and reads them after it with
:meth:`MessageTransformer.outcome`.

Plugins are named by dotted class path (``package.module.ClassName``) in the bridge
XML or the broker properties; :func:`load_transformer` imports and instantiates one. It
looks in the plugin folders first (the original's ``lib/ext``), in this order: the folders
of ``imq.bridge.transformer.path`` and of ``$IMQ_BRIDGE_TRANSFORMER_PATH`` (separated by
``os.pathsep`` or commas), ``<instance>/lib/ext`` and ``$IMQ_HOME/lib/ext``. There
``module.Class`` names ``<folder>/module.py`` (or a package ``<folder>/module/``). Anything
else is imported from the Python path as usual. The shipped transformers are
``bridgemgr.transformers.*``; their old names ``transformers.<module>.<Class>`` (from when
they were a top-level folder, a name Hugging Face's package also takes) still load them.
A name that is no Python module (``com.example.Upper``) goes to the loaders that providers
register with :func:`register_transformer_loader`: the Java provider
(bridgemgr.providers.java, registered when imported: the service and ``check`` import it
where they configure Java) takes it for a Java class when Java is configured
(imq.bridge.java.classpath, a jar in lib/ext, or a running JVM).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .jms.destination import Destination, Queue, Topic
from .jms.errors import IllegalStateException, JMSException
from .jms.message import Message, create_message

SUN_MQ = "SUN_MQ"   # the host broker's provider name, as the original passes it
STOMP = "STOMP"

_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+\Z")
TRANSFORMER_PATH_ENV = "IMQ_BRIDGE_TRANSFORMER_PATH"
TRANSFORMER_PATH_PROPERTY = "imq.bridge.transformer.path"
IMQ_HOME_ENV = "IMQ_HOME"
SHIPPED_PACKAGE = "bridgemgr.transformers"
SHIPPED_TRANSFORMERS = Path(__file__).resolve().parent / "transformers"
OLD_SHIPPED_TOP = "transformers"  # the shipped transformers' package before bridgemgr.transformers
_import_lock = threading.Lock()


@dataclass(frozen=True)
class TransformOutcome:
    """What the plugin asked for besides the returned message."""

    branch_to: Destination | str | None = None  # a destination, or a destination ref-name
    no_transfer: bool = False


class MessageTransformer(ABC):
    """Base class of every message transformer plugin."""

    def __init__(self) -> None:
        self._branch_to: Destination | str | None = None
        self._no_transfer = False
        self._in_bridge_link = False

    @abstractmethod
    def transform(self, message: Message, read_only: bool, charset_name: str | None,
                  source: str, target: str, properties: Mapping[str, Any] | None) -> Message | None:
        """Return the message to send, or None (a transform failure)."""

    # --- helpers for the plugin --------------------------------------------------------
    def create_message(self, message_type: str = "MESSAGE") -> Message:
        """A new message: MESSAGE, TEXT, BYTES, MAP, STREAM or OBJECT."""
        return create_message(message_type)

    def create_queue(self, name: str) -> Queue:
        return Queue(name)

    def create_topic(self, name: str) -> Topic:
        return Topic(name)

    def branch_to(self, destination: Destination | str) -> None:
        """Send this message to ``destination`` (or the destination ref-name) instead."""
        if not self._in_bridge_link:
            raise IllegalStateException("branch_to() is only available on a JMS bridge link")
        if not isinstance(destination, (Destination, str)) or not destination:
            raise JMSException(f"branch_to() needs a destination or a ref-name, not {destination!r}")
        self._branch_to = destination

    def no_transfer(self) -> None:
        """Consume this message from the source without sending it to the target."""
        if not self._in_bridge_link:
            raise IllegalStateException("no_transfer() is only available on a JMS bridge link")
        self._no_transfer = True

    # --- for the caller ------------------------------------------------------------------
    def reset(self, in_bridge_link: bool) -> None:
        """Clear branch_to/no_transfer before a call."""
        self._branch_to = None
        self._no_transfer = False
        self._in_bridge_link = in_bridge_link

    def outcome(self) -> TransformOutcome:
        return TransformOutcome(self._branch_to, self._no_transfer)


def split_path(text: str | None) -> list[Path]:
    """Folders of a path setting: separated by os.pathsep or commas, ~ expanded."""
    parts = (text or "").replace(",", os.pathsep).split(os.pathsep)
    return [Path(p.strip()).expanduser() for p in parts if p.strip()]


def transformer_path(setting: str | None = None,
                     instance_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The plugin folders, in search order: ``setting`` (imq.bridge.transformer.path),
    $IMQ_BRIDGE_TRANSFORMER_PATH, <instance>/lib/ext, $IMQ_HOME/lib/ext."""
    folders = split_path(setting) + split_path(os.environ.get(TRANSFORMER_PATH_ENV))
    if instance_dir is not None:
        folders.append(Path(instance_dir) / "lib" / "ext")
    if home := os.environ.get(IMQ_HOME_ENV):
        folders.append(Path(home) / "lib" / "ext")
    return list(dict.fromkeys(folders))


def shipped_modules() -> list[str]:
    """The modules of bridgemgr.transformers, by their short names (uppercase, headers, ...)."""
    return sorted(p.stem for p in SHIPPED_TRANSFORMERS.glob("*.py") if p.stem != "__init__")


def _current_name(module_name: str, folders: Sequence[Path]) -> str:
    """``module_name``, or the module it names now when it is an old name of a shipped
    transformer module: ``transformers.uppercase``, or ``uppercase`` when no plugin folder
    has one (the shipped folder used to be a plugin folder), is
    ``bridgemgr.transformers.uppercase``."""
    top, _, rest = module_name.partition(".")
    shipped = shipped_modules()
    if top == OLD_SHIPPED_TOP and (not rest or rest.partition(".")[0] in shipped):
        return f"{SHIPPED_PACKAGE}.{rest}".rstrip(".")
    if top in shipped and top not in sys.modules and not any(
            importlib.machinery.PathFinder.find_spec(top, [str(f)]) for f in folders):
        return f"{SHIPPED_PACKAGE}.{module_name}"
    return module_name


def _from_folders(top: str, folders: Sequence[Path]) -> ModuleType | None:
    """The top-level module ``top`` found in a transformer folder, loaded; None if none has it."""
    for folder in folders:
        # The folder itself as package `top`, or `top` as a module or package inside it.
        where = [str(folder.parent)] if folder.name == top else [str(folder)]
        spec = importlib.machinery.PathFinder.find_spec(top, where)
        if spec is None:
            continue
        module = importlib.util.module_from_spec(spec)  # a folder without __init__.py too
        sys.modules[top] = module
        try:
            if spec.loader is not None:
                spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[top]
            raise
        return module
    return None


def _import(module_name: str, folders: Sequence[Path]) -> ModuleType:
    top = module_name.partition(".")[0]
    with _import_lock:
        if top not in sys.modules:
            _from_folders(top, folders)
    return importlib.import_module(module_name)


@dataclass(frozen=True)
class TransformerLoader:
    """A provider's way to load transformers named by something that is no Python module."""

    kind: str  # what it loads, for the error: "... nor is it a Java transformer: ..."
    load: Callable[[str], MessageTransformer | None]  # None: its kind is not configured


_loaders: list[TransformerLoader] = []


def register_transformer_loader(kind: str, load: Callable[[str], MessageTransformer | None]) -> None:
    """Offer ``load`` the class names no Python module has (tried in the order registered).

    ``load`` returns None when it is not configured (the name stays a Python problem), the
    transformer, or raises JMSException when it cannot make one. Registering a kind again
    replaces its loader."""
    with _import_lock:
        _loaders[:] = [loader for loader in _loaders if loader.kind != kind]
        _loaders.append(TransformerLoader(kind, load))


def _from_loaders(class_path: str, python_problem: str) -> MessageTransformer | None:
    """The transformer a registered loader makes of ``class_path``; None if none takes it."""
    with _import_lock:
        loaders = list(_loaders)
    for loader in loaders:
        try:
            transformer = loader.load(class_path)
        except JMSException as exc:
            raise JMSException(f"{python_problem}; nor is it {loader.kind}: {exc}") from exc
        if transformer is not None:
            return transformer
    return None


def load_transformer(class_path: str,
                     search_path: Sequence[str | os.PathLike[str]] | None = None
                     ) -> MessageTransformer:
    """Import ``package.module.ClassName`` (transformer folders first, see the module
    doc; ``search_path`` replaces them) and make an instance; JMSException if it cannot."""
    if not _CLASS_PATH.match(class_path or ""):
        raise JMSException(f"message transformer {class_path!r} is not a dotted class name")
    module_name, _, class_name = class_path.rpartition(".")
    folders = transformer_path() if search_path is None else [Path(p) for p in search_path]
    module_name = _current_name(module_name, folders)
    try:
        cls = getattr(_import(module_name, folders), class_name)
    except (ImportError, AttributeError) as exc:
        where = ", ".join(str(f) for f in folders) or "no plugin folder"
        problem = (f"cannot load message transformer {class_path}: {exc} (looked in "
                   f"{where} and on the Python path)")
        if module_name.partition(".")[0] == OLD_SHIPPED_TOP:
            problem += (f"; the shipped transformers are {SHIPPED_PACKAGE}.<module>.<Class>, "
                        f"modules {', '.join(shipped_modules())}")
        found = _from_loaders(class_path, problem) if isinstance(exc, ModuleNotFoundError) else None
        if found is not None:
            return found
        raise JMSException(problem) from exc
    except Exception as exc:  # the module itself failed while being imported
        raise JMSException(f"cannot load message transformer {class_path}: importing "
                           f"{module_name} failed: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, MessageTransformer)):
        raise JMSException(f"{class_path} is not a subclass of bridgemgr.transform.MessageTransformer")
    try:
        return cls()
    except Exception as exc:
        raise JMSException(f"cannot create message transformer {class_path}: {exc}") from exc
