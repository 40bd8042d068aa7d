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

import ast
import builtins
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

SUN_MQ = "SUN_MQ"  # the host broker's provider name, as the original passes it
STOMP = "STOMP"

_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+\Z")
TRANSFORMER_PATH_ENV = "IMQ_BRIDGE_TRANSFORMER_PATH"
TRANSFORMER_PATH_PROPERTY = "imq.bridge.transformer.path"
IMQ_HOME_ENV = "IMQ_HOME"
SHIPPED_PACKAGE = "bridgemgr.transformers"
SHIPPED_TRANSFORMERS = Path(__file__).resolve().parent / "transformers"
OLD_SHIPPED_TOP = "transformers"  # the shipped transformers' package before bridgemgr.transformers
_import_lock = threading.Lock()
_NOT_A_TRANSFORMER = "is not a subclass of bridgemgr.transform.MessageTransformer"


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
    def transform(
        self,
        message: Message,
        read_only: bool,
        charset_name: str | None,
        source: str,
        target: str,
        properties: Mapping[str, Any] | None,
    ) -> Message | None:
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


def transformer_path(setting: str | None = None, instance_dir: str | os.PathLike[str] | None = None) -> list[Path]:
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
    if (
        top in shipped
        and top not in sys.modules
        and not any(importlib.machinery.PathFinder.find_spec(top, [str(f)]) for f in folders)
    ):
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


def load_transformer(
    class_path: str, search_path: Sequence[str | os.PathLike[str]] | None = None
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
        problem = f"cannot load message transformer {class_path}: {exc} (looked in {where} and on the Python path)"
        if module_name.partition(".")[0] == OLD_SHIPPED_TOP:
            problem += (
                f"; the shipped transformers are {SHIPPED_PACKAGE}.<module>.<Class>, "
                f"modules {', '.join(shipped_modules())}"
            )
        found = _from_loaders(class_path, problem) if isinstance(exc, ModuleNotFoundError) else None
        if found is not None:
            return found
        raise JMSException(problem) from exc
    except Exception as exc:  # the module itself failed while being imported
        raise JMSException(
            f"cannot load message transformer {class_path}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, MessageTransformer)):
        raise JMSException(f"{class_path} {_NOT_A_TRANSFORMER}")
    try:
        return cls()
    except Exception as exc:
        raise JMSException(f"cannot create message transformer {class_path}: {exc}") from exc


# --- checking a transformer without importing it (imqbridgemgr check) ---------------------
#
# inspect_transformer() finds the module as load_transformer() would (the plugin folders,
# then the Python path), but with PathFinder.find_spec one level at a time, which runs no
# package's __init__, and reads the class from the module's source with ast: a plain class
# statement at the module's top level, its bases followed to MessageTransformer (through
# classes of the same module, modules found the same way, or bridgemgr's own modules,
# which are imported: they are ours), a concrete transform() and an __init__ that needs
# no arguments. Where the source cannot say (a compiled module, a class made dynamically,
# decorated or imported from elsewhere, a base given by an expression) the module is
# imported after all, as load_transformer does, and the result says why.

_BASE = f"{__name__}.MessageTransformer"
_OURS = __name__.partition(".")[0]


@dataclass(frozen=True)
class TransformerInspection:
    """How a transformer was checked: ``source`` the file read (None: not read), and
    ``imported`` why its module had to be imported (None: its import-time code did not run
    here, or it is bridgemgr's own or was imported before)."""

    class_path: str
    source: str | None = None
    imported: str | None = None


class _NeedsImport(Exception):
    """The source cannot say; the message is why."""


@dataclass
class _Module:
    name: str
    path: str
    tree: ast.Module
    package: str  # what a relative import is relative to


def _find_spec(module_name: str, folders: Sequence[Path]) -> tuple[Any, str | None]:
    """The spec of ``module_name`` found as load_transformer would find it, without
    running any code, and None with the missing module's name when there is none."""
    parts = module_name.split(".")
    top = parts[0]
    spec = None
    for folder in folders:
        where = [str(folder.parent)] if folder.name == top else [str(folder)]
        spec = importlib.machinery.PathFinder.find_spec(top, where)
        if spec is not None:
            break
    else:
        spec = importlib.machinery.PathFinder.find_spec(top)
    for i in range(1, len(parts)):
        if spec is None:
            return None, ".".join(parts[:i])
        if spec.submodule_search_locations is None:
            return None, ".".join(parts[: i + 1])
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    return (spec, None) if spec is not None else (None, module_name)


def _read_module(module_name: str, spec: Any) -> _Module:
    loader = spec.loader
    if not isinstance(loader, importlib.machinery.SourceFileLoader):
        what = "a compiled module" if spec.origin and spec.has_location else "not a module with a source file"
        raise _NeedsImport(f"{module_name} is {what} ({spec.origin or 'no file'})")
    try:
        source = loader.get_source(module_name)
        tree = ast.parse(source or "", spec.origin)
    except (ImportError, OSError) as exc:
        raise _NeedsImport(f"the source of {module_name} cannot be read ({exc})") from None
    except (SyntaxError, ValueError) as exc:
        raise JMSException(f"importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    package = module_name if spec.submodule_search_locations is not None else module_name.rpartition(".")[0]
    return _Module(module_name, spec.origin, tree, package)


def _bindings(module: _Module, name: str) -> list[Any]:
    """The top-level statements of ``module`` that bind ``name`` (ast nodes); a statement
    that may bind it in a way the source does not show (a star import, a block) counts."""
    found: list[ast.stmt] = []
    for node in module.tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == name:
                found.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.partition(".")[0]) == name or a.name == "*" for a in node.names):
                found.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                found.append(node)
        elif any(
            getattr(n, "name", None) == name
            or getattr(n, "asname", None) == name
            or (isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store))
            for n in ast.walk(node)
        ):  # in a block (if, try, with ...): whatever it does
            found.append(node)
    return found


def _qualified(module: _Module, expr: Any) -> str | None:
    """The dotted name a base class expression refers to through the module's imports
    (``pkg.mod.Cls``), ``.Name`` for a class of the module itself; None if unknown."""
    chain: list[str] = []
    while isinstance(expr, ast.Attribute):
        chain.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    head = expr.id
    bound = _bindings(module, head)
    if not bound and hasattr(builtins, head):
        return ".".join(["builtins", head, *chain])
    if len(bound) != 1:
        return None
    node = bound[0]
    if isinstance(node, ast.ClassDef) and not chain:
        return f".{head}"
    if isinstance(node, ast.Import):
        alias = next(a for a in node.names if (a.asname or a.name.partition(".")[0]) == head)
        return ".".join([alias.name if alias.asname else head, *chain])
    if isinstance(node, ast.ImportFrom) and not any(a.name == "*" for a in node.names):
        alias = next(a for a in node.names if (a.asname or a.name) == head)
        base = node.module or ""
        if node.level:
            package = module.package.split(".")
            if not module.package or node.level - 1 >= len(package):
                return None
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        return ".".join([base, alias.name, *chain])
    return None


class _Inspector:
    def __init__(self, folders: Sequence[Path]) -> None:
        self.folders = folders
        self.modules: dict[str, _Module] = {}
        self.source: str | None = None

    def module(self, module_name: str) -> _Module:
        if module_name not in self.modules:
            # The plugin folders hold the checked module's own package; what it imports from
            # elsewhere comes from the Python path, as when a start imports it.
            top = module_name.partition(".")[0]
            folders = self.folders if not self.modules or top == next(iter(self.modules)).partition(".")[0] else []
            spec, missing = _find_spec(module_name, folders)
            if spec is None:
                raise _NeedsImport(f"{missing} is no file in the plugin folders or on the Python path")
            self.modules[module_name] = _read_module(module_name, spec)
        return self.modules[module_name]

    def class_of(self, module_name: str, class_name: str) -> Any:
        """The ClassDef of ``module_name.class_name``; JMSException if the module has none."""
        module = self.module(module_name)
        bound = _bindings(module, class_name)
        if not bound:
            if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in module.tree.body):
                raise _NeedsImport(f"{module_name} makes its names with __getattr__")
            raise JMSException(f"module {module_name!r} has no attribute {class_name!r}")
        node = bound[0]
        if len(bound) > 1 or not isinstance(node, ast.ClassDef):
            raise _NeedsImport(
                f"{class_name} is not one plain class statement in {module.path} "
                "(assigned, imported or defined in a block)"
            )
        if node.decorator_list or node.keywords:
            raise _NeedsImport(f"class {class_name} in {module.path} is decorated or has a metaclass")
        return node

    def lineage(self, module_name: str, class_name: str, depth: int = 0) -> tuple[bool, bool]:
        """Does the class extend MessageTransformer, and does it (or a base) define
        transform()? JMSException when the source shows it cannot be one."""
        if depth > 8:
            raise _NeedsImport(f"the bases of {class_name} go too deep to follow")
        node = self.class_of(module_name, class_name)
        module = self.modules[module_name]
        concrete = any(
            (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "transform")
            or (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "transform" for t in n.targets))
            for n in node.body
        )
        is_transformer = False
        for base in node.bases:
            name = _qualified(module, base)
            if name is None:
                raise _NeedsImport(
                    f"a base class of {class_name} ({ast.unparse(base)}) is not a name the source can follow"
                )
            base_module, _, base_class = (module_name, "", name[1:]) if name.startswith(".") else name.rpartition(".")
            if f"{base_module}.{base_class}" == _BASE:
                is_transformer = True
            elif base_module.partition(".")[0] == _OURS or base_module in sys.modules:
                try:
                    cls = getattr(importlib.import_module(base_module), base_class, None)
                except ImportError as exc:
                    raise JMSException(f"the base class {name} of {class_name} cannot be imported: {exc}") from None
                if isinstance(cls, type) and issubclass(cls, MessageTransformer):
                    is_transformer = True
                    concrete = concrete or "transform" not in getattr(cls, "__abstractmethods__", ())
            elif (base_module, base_class) == (module_name, class_name):
                raise JMSException(f"class {class_name} names itself as its base")
            else:
                extends, defines = self.lineage(base_module, base_class, depth + 1)
                is_transformer = is_transformer or extends
                concrete = concrete or (extends and defines)
        return is_transformer, concrete

    def check(self, module_name: str, class_name: str) -> None:
        """JMSException unless the class is a transformer the service can create."""
        is_transformer, concrete = self.lineage(module_name, class_name)
        self.source = self.modules[module_name].path
        class_path = f"{module_name}.{class_name}"
        if not is_transformer:
            raise JMSException(f"{class_path} {_NOT_A_TRANSFORMER}")
        if not concrete:
            raise JMSException(
                f"cannot create message transformer {class_path}: it defines no "
                "transform() (MessageTransformer's is abstract)"
            )
        node = self.class_of(module_name, class_name)
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is not None:
            args = init.args
            required = len(args.posonlyargs) + len(args.args) - 1 - len(args.defaults)
            if required > 0 or any(d is None for d in args.kw_defaults):
                raise JMSException(
                    f"cannot create message transformer {class_path}: its __init__ "
                    f"(line {init.lineno}) takes arguments; the service passes none"
                )


def inspect_transformer(
    class_path: str, search_path: Sequence[str | os.PathLike[str]] | None = None
) -> TransformerInspection:
    """Check ``class_path`` as load_transformer would load it, from the module's source
    where it can (no plugin code runs); else import it as load_transformer does and say
    why. JMSException with load_transformer's wording when it is no usable transformer."""
    if not _CLASS_PATH.match(class_path or ""):
        raise JMSException(f"message transformer {class_path!r} is not a dotted class name")
    module_name, _, class_name = class_path.rpartition(".")
    folders = transformer_path() if search_path is None else [Path(p) for p in search_path]
    module_name = _current_name(module_name, folders)
    if module_name.partition(".")[0] == _OURS or module_name in sys.modules:
        load_transformer(class_path, search_path)  # ours, or imported already: nothing new runs
        return TransformerInspection(class_path)
    inspector = _Inspector(folders)
    try:
        inspector.check(module_name, class_name)
    except _NeedsImport as why:
        load_transformer(class_path, search_path)  # its errors, its Java loaders for a name no module has
        imported = module_name in sys.modules  # not so for a Java class
        return TransformerInspection(class_path, inspector.source, str(why) if imported else None)
    except JMSException as exc:
        message = str(exc)
        if not message.startswith(("cannot create", f"{module_name}.{class_name} is not")):
            message = f"cannot load message transformer {class_path}: {message}"
        raise JMSException(message) from None
    return TransformerInspection(class_path, inspector.source)
