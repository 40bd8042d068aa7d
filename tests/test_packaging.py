"""The installed package carries every module and the DTD (not only the source tree)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "bridgemgr").rglob("__init__.py")}
    assert found | {"bridgemgr.dtd"} == listed


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_wheel_contains_the_dtd_and_the_console_script(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("imqbridge-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "bridgemgr/dtd/sun_jmsbridge_1_0.dtd" in names
    assert "bridgemgr/providers/embedded/store.py" in names
    assert "bridgemgr/providers/java/src/com/sun/messaging/bridge/service/MessageTransformer.java" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "imqbridgemgr = bridgemgr.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
