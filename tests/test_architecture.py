"""The import rules of docs/architecture.md ("What may import what"), checked on the source.

The rules are import-linter contracts in pyproject.toml ([tool.importlinter]); the first tests
run lint-imports on them and check that every package folder of bridgemgr/ is named by one.
For what import-linter does not see (cycles, literal dynamic imports, names), every module of
``bridgemgr`` is parsed with ``ast``; every import counts, at module level or inside a
function, and so do ``importlib.import_module("...")`` and ``__import__("...")`` with a
literal name. Nothing is imported, so a test run needs none of the optional servers.
Between layers an import under ``if TYPE_CHECKING:`` counts too (a layer that names another's
types depends on it); inside a package it does not make a cycle, since nothing runs it.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import subprocess
import sys
import tokenize
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bridgemgr"


def _package_folders() -> list[str]:
    """Every package of bridgemgr by dotted name, found from its folders (an __init__.py)."""
    return sorted(".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py"))


# The nodes of the layer graph: every package folder with none below it (jms, xa,
# providers/embedded, ...), and every other module of bridgemgr (transform, service, cli,
# props, the providers package's own __init__, ...) on its own.
SUBPACKAGES = tuple(p for p in _package_folders() if not any(other.startswith(p + ".") for other in _package_folders()))

EMBEDDED = "bridgemgr.providers.embedded"
# The host broker's internals: nothing outside providers/embedded/ imports these modules,
# or Broker, Envelope and Work from anywhere.
# broker.py (the Broker facade) and the modules of its parts (docs/architecture.md, providers/)
BROKER_PARTS = (
    "broker",
    "state",
    "paging",
    "destinations",
    "dstcontrol",
    "routing",
    "delivery",
    "localtx",
    "xabranches",
    "adoption",
)
BROKER_PART_LINES = 600  # issue 37: no part grows back into one class of 1,800 lines
BROKER_INTERNALS = tuple(f"{EMBEDDED}.{name}" for name in (*BROKER_PARTS, "queues", "store", "channel", "wire"))
BROKER_NAMES = {"Broker", "Envelope", "Work"}

# Accepted violations, as (importing module below bridgemgr, "module:name" or "module" it takes):
# none since the service opens the host broker through providers/embedded/host.py's
# open_host_broker. An entry that no longer matches an import fails the test, so the list
# only shrinks.
ALLOWLIST: set[tuple[str, str]] = set()


PYPROJECT = ROOT / "pyproject.toml"


def _lint_imports(config: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports (import-linter) on bridgemgr of this checkout with the contracts of ``config``."""
    command = Path(sys.executable).with_name("lint-imports")
    assert command.exists(), "lint-imports is missing: pip install -e '.[test]' (import-linter)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [str(command), str(config), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow  # about 1 s: import-linter builds the graph
def test_the_import_contracts_hold():
    run = _lint_imports(PYPROJECT)
    assert run.returncode == 0, (
        "import contracts broken (pyproject.toml, [tool.importlinter]):\n"
        + run.stdout[run.stdout.find("Contracts") :]
        + run.stderr
    )


@pytest.mark.slow
def test_lint_imports_fails_on_a_broken_contract(tmp_path):
    """The check can fail: the layers turned upside down break."""
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    upside_down = [f'"{layer}"' for layer in reversed(layers["layers"])]
    (tmp_path / "contracts.toml").write_text(
        '[tool.importlinter]\nroot_package = "bridgemgr"\n\n[[tool.importlinter.contracts]]\n'
        'name = "upside down"\ntype = "layers"\ncontainers = ["bridgemgr"]\n'
        f"layers = [{', '.join(upside_down)}]\n",
        encoding="utf-8",
    )
    run = _lint_imports(tmp_path / "contracts.toml")
    assert run.returncode == 1 and "upside down BROKEN" in run.stdout, run.stdout + run.stderr
    assert "bridgemgr.jmsbridge is not allowed to import bridgemgr.jms:" in run.stdout


def _named_by_contracts() -> set[str]:
    """Every module expression the contracts name (a layer with its container prefixed)."""
    named: set[str] = set()
    for contract in tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]:
        for container in contract.get("containers", [""]):
            for layer in contract.get("layers", []):
                named.update(f"{container}.{m.strip()}".strip(".") for m in re.split(r"[|:]", layer))
        for key in ("modules", "source_modules", "forbidden_modules", "protected_modules", "allowed_importers"):
            named.update(contract.get(key, []))
    return named


def _matches(expression: str, module: str) -> bool:
    """Whether import-linter's module expression (``*``: one part, ``**``: any) names ``module``."""
    pattern = re.escape(expression).replace(r"\*\*", ".+").replace(r"\*", "[^.]+")
    return re.fullmatch(pattern, module) is not None


def test_every_package_folder_is_named_by_a_contract():
    named = _named_by_contracts()
    packages = [p for p in _package_folders() if p != "bridgemgr"]
    assert "bridgemgr.providers.amqp" in packages and "bridgemgr.parallel" in packages  # the walk found them
    missing = [p for p in packages if not any(_matches(e, p) for e in named)]
    assert not missing, f"pyproject.toml, [tool.importlinter]: no contract names {missing}"


@dataclass(frozen=True)
class Import:
    """One import statement's target, as the module that holds it sees it."""

    module: str  # the importing module, e.g. bridgemgr.spark.sink
    line: int
    target: str  # the module imported, e.g. bridgemgr.spark.transfer
    names: tuple[str, ...]  # the names taken from it (from-imports), else ()
    type_only: bool = False  # under `if TYPE_CHECKING:`

    def where(self) -> str:
        path = MODULES[self.module].relative_to(ROOT) if self.module in MODULES else self.module
        return (
            f"{path}:{self.line} imports {self.target}"
            + (f" ({', '.join(self.names)})" if self.names else "")
            + (" [TYPE_CHECKING]" if self.type_only else "")
        )


def _modules() -> dict[str, Path]:
    """Every module of bridgemgr by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _literal_import_call(node: ast.Call) -> str | None:
    """The module name of ``importlib.import_module("x")`` or ``__import__("x")``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def parse_imports(module: str, source: str, is_package: bool = False) -> Iterator[Import]:
    """Every import in ``source``, the text of ``module``, with relative names resolved."""
    tree = ast.parse(source)
    type_only = _type_checking_nodes(tree)
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        typed = id(node) in type_only
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, node.lineno, alias.name, (), typed)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = []
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:  # `from pkg import mod`: the module pkg.mod
                    yield Import(module, node.lineno, f"{target}.{alias.name}", (), typed)
                else:
                    names.append(alias.name)
            if names:
                yield Import(module, node.lineno, target, tuple(names), typed)
        elif isinstance(node, ast.Call):
            target = _literal_import_call(node)
            if target is None:
                continue
            fromlist: tuple[str, ...] = ()
            for keyword in node.keywords:
                if keyword.arg == "fromlist" and isinstance(keyword.value, (ast.List, ast.Tuple)):
                    fromlist = tuple(
                        e.value for e in keyword.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    )
            modules = [f"{target}.{name}" for name in fromlist if f"{target}.{name}" in MODULES]
            for found in modules:
                yield Import(module, node.lineno, found, (), typed)
            if not modules:
                yield Import(module, node.lineno, target, fromlist, typed)


def _imports(module: str) -> Iterator[Import]:
    return parse_imports(module, MODULES[module].read_text(), _is_package(module))


@functools.cache
def imports() -> list[Import]:
    """Every import of one bridgemgr module by another (parsed once, when a test first asks:
    not at collection, which every xdist worker pays)."""
    return [imp for module in MODULES for imp in _imports(module) if imp.target.startswith("bridgemgr")]


# The package itself (bridgemgr/__init__.py: __version__, and connect() for users' own
# programs) is the package's face, as any package's __init__ may re-export its modules: its
# imports make no edges.
FACE = "bridgemgr"


def _layer(module: str) -> str:
    """The node of the layer graph that ``module`` belongs to."""
    for package in SUBPACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    return module


def _package_module(module: str) -> tuple[str, str]:
    """(package, module inside it) for the graph of a package's own modules.

    A module in a folder below a package (spark/sitepath/) counts as its package's.
    """
    for package in sorted((m for m in MODULES if _is_package(m)), key=len, reverse=True):
        if module.startswith(package + "."):
            return package, package + "." + module[len(package) + 1 :].split(".")[0]
    return module.rpartition(".")[0], module


def _cycles(edges: dict[tuple[str, str], list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _report(cycles: list[list[str]], edges: dict[tuple[str, str], list[Import]]) -> str:
    """Each cycle with the import lines of its edges (the first few of a wide edge)."""
    lines = []
    for component in cycles:
        members = set(component)
        lines.append("cycle: " + " <-> ".join(component))
        for (a, b), imports in sorted(edges.items()):
            if a in members and b in members:
                lines.append(f"  {a} -> {b}:")
                lines.extend(f"    {imp.where()}" for imp in imports[:6])
                if len(imports) > 6:
                    lines.append(f"    ... and {len(imports) - 6} more")
    return "\n".join(lines)


def _resolved(target: str) -> str:
    """``target`` as a module of bridgemgr (a from-import of a name: its module)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target


def test_the_parser_sees_every_kind_of_import():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import importlib\n"
        "from . import sink\n"  # a module of the package
        "from ..jmsbridge.link import Link\n"  # a name from a module
        "if TYPE_CHECKING:\n"
        "    from ..jms.spi import Session\n"
        "def later():\n"
        "    from ..admincli import open_admin\n"  # inside a function
        "    importlib.import_module('bridgemgr.providers.java')\n"
        "    return __import__('bridgemgr.spark.drain', fromlist=['drain'])\n"
    )
    found = {
        (imp.line, imp.target, imp.names, imp.type_only) for imp in parse_imports("bridgemgr.spark.runner", source)
    }
    assert found >= {
        (3, "bridgemgr.spark.sink", (), False),
        (4, "bridgemgr.jmsbridge.link", ("Link",), False),
        (6, "bridgemgr.jms.spi", ("Session",), True),
        (8, "bridgemgr.admincli", ("open_admin",), False),
        (9, "bridgemgr.providers.java", (), False),
        (10, "bridgemgr.spark.drain", ("drain",), False),
    }


def test_no_cycle_between_layers():
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in imports():
        a, b = _layer(imp.module), _layer(_resolved(imp.target))
        if a != b and FACE not in (a, b):
            edges.setdefault((a, b), []).append(imp)
    cycles = _cycles(edges)
    assert not cycles, "import cycles between the layers of bridgemgr:\n" + _report(cycles, edges)


def test_no_cycle_between_the_modules_of_a_package():
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in imports():
        if imp.type_only:
            continue
        target = _resolved(imp.target)
        (package_a, a), (package_b, b) = _package_module(imp.module), _package_module(target)
        # a package's __init__ is its face: it may re-export its modules
        if package_a == package_b and a != b and package_a not in (a, b):
            edges.setdefault((a, b), []).append(imp)
    cycles = _cycles(edges)
    assert not cycles, "import cycles inside a package:\n" + _report(cycles, edges)


def test_jms_is_the_bottom_layer():
    outside = [
        imp.where()
        for imp in imports()
        if _layer(imp.module) == "bridgemgr.jms" and _layer(_resolved(imp.target)) != "bridgemgr.jms"
    ]
    assert not outside, "bridgemgr/jms imports the rest of bridgemgr:\n" + "\n".join(outside)


def _broker_internals(imp: Import) -> list[str]:
    """What of the host broker's internals ``imp`` takes: "module" or "module:name" each."""
    target = _resolved(imp.target)
    if any(target == m or target.startswith(m + ".") for m in BROKER_INTERNALS):
        return [f"{target}:{name}" for name in imp.names] or [target]
    if target.startswith(EMBEDDED):
        return [f"{target}:{name}" for name in imp.names if name in BROKER_NAMES]
    return []


def test_nothing_outside_the_embedded_broker_touches_its_internals():
    found: dict[tuple[str, str], Import] = {}
    for imp in imports():
        if _layer(imp.module) != EMBEDDED:
            for what in _broker_internals(imp):
                found.setdefault((imp.module.removeprefix("bridgemgr."), what), imp)
    new = sorted(f"{imp.where()}: {what}" for (module, what), imp in found.items() if (module, what) not in ALLOWLIST)
    assert not new, (
        "imports of the host broker's internals outside providers/embedded/ "
        "(reach it through the HostBroker interface):\n" + "\n".join(new)
    )
    gone = sorted(f"{module}: {what}" for module, what in ALLOWLIST if (module, what) not in found)
    assert not gone, (
        "allowlisted imports of the host broker's internals that are gone; "
        "remove them from ALLOWLIST:\n" + "\n".join(gone)
    )


def test_the_broker_parts_stay_small():
    sizes = {
        name: len((PACKAGE / "providers" / "embedded" / f"{name}.py").read_text(encoding="utf-8").splitlines())
        for name in BROKER_PARTS
    }
    big = {name: size for name, size in sizes.items() if size > BROKER_PART_LINES}
    assert not big, (
        f"broker parts over {BROKER_PART_LINES} lines (split along a seam: docs/architecture.md, providers/): {big}"
    )


# A threading Lock, RLock or Condition made on a line that is no comment.
LOCK_MADE = re.compile(r"^[^#\n]*\bthreading\.(?:Lock|RLock|Condition)\(", re.MULTILINE)


def _modules_with_locks() -> set[str]:
    """Every module (its path below bridgemgr/) that makes a threading lock or condition."""
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if LOCK_MADE.search(path.read_text(encoding="utf-8"))
    }


def test_threads_and_locks_names_every_module_with_a_lock():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Threads and locks", 1)[1].split("\n## ", 1)[0]
    modules = _modules_with_locks()
    assert len(modules) > 30  # the walk found them
    missing = sorted(m for m in modules if f"`{m}`" not in section)
    assert not missing, f"docs/architecture.md, Threads and locks: add the locks of {missing}"


# Module docs (docs/architecture.md, top): a module's docstring says what it is for, in at
# most MAX_DOCSTRING_LINES lines, and nothing but a shebang or license line stands before it
# (help() and editors show only the docstring); longer design notes go to docs/, named by a
# "Design notes: docs/PAGE.md#anchor" line of the docstring, and every docs/PAGE.md#anchor a
# docstring names must be a heading there.
MAX_DOCSTRING_LINES = 25
MAX_LINES_BEFORE_DOCSTRING = 1  # a shebang or a license line
DOCS_POINTER = re.compile(r"\b(docs/[\w.-]+\.md)#([\w-]+)")


@dataclass(frozen=True)
class ModuleHead:
    """How a module opens: comment lines before its first statement, and its docstring."""

    comment_lines: int
    docstring: str | None
    docstring_lines: int


def module_head(source: str) -> ModuleHead:
    """Read with tokenize up to the first statement only (a whole-package ast.parse is slow)."""
    comments = 0
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            comments += 1
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            break
    else:
        return ModuleHead(comments, None, 0)
    if tok.type != tokenize.STRING or next(tokens).type not in (tokenize.NEWLINE, tokenize.ENDMARKER):
        return ModuleHead(comments, None, 0)
    return ModuleHead(comments, ast.literal_eval(tok.string), tok.end[0] - tok.start[0] + 1)


def _module_docs_checked() -> list[Path]:
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 100  # the walk found them
    return paths


def test_module_head_sees_a_comment_block_and_the_docstring_length():
    assert module_head('# How it works: one\n# two\n"""Doc."""\nx = 1\n') == ModuleHead(2, "Doc.", 1)
    assert module_head('#!/usr/bin/env python3\n"""Doc.\n\nMore.\n"""\n') == ModuleHead(1, "Doc.\n\nMore.\n", 4)
    assert module_head("# a comment before code\nx = 1\n") == ModuleHead(1, None, 0)


def test_no_comment_block_before_a_module_docstring():
    found = [
        f"{p.relative_to(ROOT)}: {head.comment_lines} comment lines"
        for p in _module_docs_checked()
        if (head := module_head(p.read_text(encoding="utf-8"))).comment_lines > MAX_LINES_BEFORE_DOCSTRING
    ]
    assert not found, (
        "modules open with a comment block before the docstring (help() never shows it): "
        "make it the docstring, the longer design notes a section of docs/:\n" + "\n".join(found)
    )


def test_module_docstrings_are_short():
    found = [
        f"{p.relative_to(ROOT)}: {head.docstring_lines} lines"
        for p in _module_docs_checked()
        if (head := module_head(p.read_text(encoding="utf-8"))).docstring_lines > MAX_DOCSTRING_LINES
    ]
    assert not found, (
        f"module docstrings over {MAX_DOCSTRING_LINES} lines: keep what the module is for and "
        "the rules that matter, move design notes to docs/ (Design notes: docs/X.md#anchor):\n" + "\n".join(found)
    )


def test_docs_pointers_of_module_docstrings_resolve():
    from test_docs import anchors  # the anchors the links of docs/ are checked against

    pointers = [
        (p, m.group(1), m.group(2))
        for p in sorted(PACKAGE.rglob("*.py"))
        for m in DOCS_POINTER.finditer(module_head(p.read_text(encoding="utf-8")).docstring or "")
    ]
    assert len(pointers) > 30  # the modules whose design notes moved to docs/
    headings = {page: anchors(ROOT / page) for page in {page for _, page, _ in pointers} if (ROOT / page).is_file()}
    broken = [
        f"{p.relative_to(ROOT)}: {page}#{anchor}"
        for p, page, anchor in pointers
        if anchor not in headings.get(page, ())
    ]
    assert not broken, "module docstrings point at no heading of docs/:\n" + "\n".join(broken)
