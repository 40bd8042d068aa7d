"""`imqbridgemgr check` inspects a transformer plugin from its module's source (ast) without
running the module's import-time code, and says so where it has to import it (a compiled
module, a class made dynamically); what it accepts and refuses is what a start's
load_transformer accepts and refuses."""

from __future__ import annotations

import itertools
import py_compile
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridgemgr import transform
from bridgemgr.cli import main
from bridgemgr.jms.errors import JMSException
from bridgemgr.transform import (
    MessageTransformer,
    inspect_transformer,
    load_transformer,
    register_transformer_loader,
)
from bridgemgr.transformers.uppercase import UppercaseTransformer
from test_check import xml_with

_ids = itertools.count(1)

IMPORTS = "from bridgemgr.transform import MessageTransformer\n"
TRANSFORM = (
    "    def transform(self, message, read_only, charset_name, source, target, props):\n        return message\n"
)


def marker_code(marker: Path) -> str:
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A plugin folder on IMQ_BRIDGE_TRANSFORMER_PATH; the modules written there are
    forgotten by sys.modules afterwards."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.setenv("IMQ_BRIDGE_TRANSFORMER_PATH", str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        del sys.modules[name]


def module_name(prefix: str = "plug") -> str:
    return f"{prefix}_{next(_ids)}_c3f1"


def check(tmp_path: Path, class_path: str):
    xml = xml_with(tmp_path, target=f'message-transformer-class="{class_path}"')
    return xml, CliRunner().invoke(main, ["check", str(xml)], catch_exceptions=False)


def test_check_reports_the_class_without_running_the_modules_import_time_code(tmp_path, plugins):
    marker = tmp_path / "imported.txt"
    name = module_name()
    (plugins / f"{name}.py").write_text(
        marker_code(marker) + IMPORTS + "class Stamp(MessageTransformer):\n" + TRANSFORM
    )
    _, result = check(tmp_path, f"{name}.Stamp")
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and f", transformer {name}.Stamp" in result.stdout
    assert not marker.exists() and name not in sys.modules
    load_transformer(f"{name}.Stamp")  # what a start does: the module runs
    assert marker.read_text() == "imported"


def test_a_compiled_module_is_imported_and_check_says_so(tmp_path, plugins):
    marker = tmp_path / "imported.txt"
    name = module_name()
    source = plugins / f"{name}.py"
    source.write_text(marker_code(marker) + IMPORTS + "class Stamp(MessageTransformer):\n" + TRANSFORM)
    py_compile.compile(str(source), cfile=str(plugins / f"{name}.pyc"), doraise=True)
    source.unlink()  # only the compiled module is left
    xml, result = check(tmp_path, f"{name}.Stamp")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"{xml}:5: warning: link l: transformer {name}.Stamp was imported to check it, so its module's "
        f"import-time code ran here: {name} is a compiled module ({plugins / f'{name}.pyc'})"
    ]
    assert marker.exists()


def test_a_class_made_dynamically_is_imported_and_check_says_so(tmp_path, plugins):
    marker = tmp_path / "imported.txt"
    name = module_name()
    (plugins / f"{name}.py").write_text(
        marker_code(marker)
        + IMPORTS
        + "Stamp = type('Stamp', (MessageTransformer,), {'transform': lambda self, m, *a: m})\n"
    )
    xml, result = check(tmp_path, f"{name}.Stamp")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(
        f"{xml}:5: warning: link l: transformer {name}.Stamp was imported to "
        "check it, so its module's import-time code ran here: Stamp is not one "
        f"plain class statement in {plugins / f'{name}.py'}"
    )
    assert marker.exists()


def test_a_class_the_source_shows_is_no_transformer_fails_the_check_without_importing(tmp_path, plugins):
    marker = tmp_path / "imported.txt"
    name = module_name()
    (plugins / f"{name}.py").write_text(marker_code(marker) + "class Stamp:\n" + TRANSFORM)
    xml, result = check(tmp_path, f"{name}.Stamp")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith(
        f"{xml}:5: link l: {name}.Stamp is not a subclass of bridgemgr.transform.MessageTransformer; put the module in"
    )
    assert not marker.exists()


# What the source shows, and whether a start's load_transformer accepts it: inspect_transformer
# must agree, and name the same cause.
CASES = {
    "plain": (IMPORTS + "class T(MessageTransformer):\n" + TRANSFORM, None),
    "module import": ("import bridgemgr.transform as bt\nclass T(bt.MessageTransformer):\n" + TRANSFORM, None),
    "from package": ("from bridgemgr import transform\nclass T(transform.MessageTransformer):\n" + TRANSFORM, None),
    "local base": (IMPORTS + "class Base(MessageTransformer):\n" + TRANSFORM + "class T(Base):\n    pass\n", None),
    "abstract local base": (
        IMPORTS + "class Base(MessageTransformer):\n    pass\nclass T(Base):\n    pass\n",
        "defines no transform()",
    ),
    "shipped base": (
        "from bridgemgr.transformers.uppercase import UppercaseTransformer\nclass T(UppercaseTransformer):\n    pass\n",
        None,
    ),
    # the plugin folder is no folder of the Python path: its other modules are not found
    "base in another plugin": ("from {other} import Base\nclass T(Base):\n    pass\n", "No module named"),
    "abstract": (IMPORTS + "class T(MessageTransformer):\n    pass\n", "defines no transform()"),
    "not a transformer": ("class T(object):\n" + TRANSFORM, "is not a subclass"),
    "no such class": (IMPORTS + "class U(MessageTransformer):\n" + TRANSFORM, "has no attribute 'T'"),
    "init needs arguments": (
        IMPORTS + "class T(MessageTransformer):\n    def __init__(self, x):\n        super().__init__()\n" + TRANSFORM,
        "cannot create message transformer",
    ),
    "init with defaults": (
        IMPORTS + "class T(MessageTransformer):\n    def __init__(self, x=1, *, y=2):\n"
        "        super().__init__()\n" + TRANSFORM,
        None,
    ),
    "syntax error": (IMPORTS + "class T(MessageTransformer)\n" + TRANSFORM, "SyntaxError"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_accepts_and_refuses_what_a_start_would(tmp_path, plugins, case):
    source, cause = CASES[case]
    other = module_name("other")
    (plugins / f"{other}.py").write_text(IMPORTS + "class Base(MessageTransformer):\n" + TRANSFORM)
    checked, loaded = module_name(), module_name()
    for name in (checked, loaded):
        (plugins / f"{name}.py").write_text(source.format(other=other))
    try:
        inspected = inspect_transformer(f"{checked}.T")
    except JMSException as exc:
        inspected = exc
    try:
        transformer = load_transformer(f"{loaded}.T")
    except JMSException as exc:
        transformer = exc
    assert checked not in sys.modules
    assert other not in sys.modules or case == "base in another plugin"  # the start imported it
    if cause is None:
        assert isinstance(transformer, MessageTransformer)
        assert not isinstance(inspected, Exception) and inspected.imported is None, inspected
        assert inspected.source == str(plugins / f"{checked}.py")
    else:
        assert isinstance(transformer, JMSException) and isinstance(inspected, JMSException)
        assert cause in str(inspected), (str(inspected), str(transformer))
        assert str(inspected).partition(":")[0] == str(transformer).partition(":")[0].replace(loaded, checked)


def test_a_plugin_package_is_read_without_running_its_init(tmp_path, plugins):
    marker = tmp_path / "imported.txt"
    package = plugins / module_name("pkg")
    package.mkdir()
    (package / "__init__.py").write_text(marker_code(marker))
    (package / "base.py").write_text(marker_code(marker) + IMPORTS + "class Base(MessageTransformer):\n" + TRANSFORM)
    (package / "routing.py").write_text("from .base import Base\nclass Router(Base):\n    pass\n")
    inspected = inspect_transformer(f"{package.name}.routing.Router")
    assert inspected.imported is None and inspected.source == str(package / "routing.py")
    assert not marker.exists() and package.name not in sys.modules
    assert isinstance(load_transformer(f"{package.name}.routing.Router"), MessageTransformer)  # as a start
    assert marker.exists()


def test_a_class_a_provider_loads_is_no_python_import(plugins, monkeypatch):
    """A name no Python module has goes to the providers' loaders (Java's, in the service),
    as in a start; no module of the plugin folders ran, so there is nothing to warn of.
    (A registry of its own: the Java provider's loader, registered once a test imported
    it, refuses a class its JVM lacks before this test's loader is asked; and this test's
    loader is gone afterwards.)"""
    monkeypatch.setattr(transform, "_loaders", [])
    name = f"com.example{next(_ids)}.Upper"
    register_transformer_loader(
        "a test provider's class", lambda path: UppercaseTransformer() if path == name else None
    )
    inspected = inspect_transformer(name)
    assert inspected.imported is None and inspected.source is None
