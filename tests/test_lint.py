"""The test command lints: ruff (style, import order, likely bugs; and the formatting,
ruff format) and mypy (types; strict for bridgemgr.jms and bridgemgr.jmsbridge), as
configured in pyproject.toml. A finding fails the suite; the tools' own output says what
to fix (`ruff format .` fixes the formatting)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(600)]


def _run(module: str, *args: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it comes with the test extra: pip install -e '.[test]')")
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"{module} {' '.join(args)} found problems:\n{result.stdout}{result.stderr}"


def test_ruff() -> None:
    _run("ruff", "check", "--no-cache", ".")


def test_ruff_format() -> None:
    _run("ruff", "format", "--check", "--no-cache", ".")


@pytest.mark.slow  # 5-6 s with a cold cache (.mypy_cache); ruff (0.4 s) stays in the fast tier
def test_mypy() -> None:
    _run("mypy")  # files, flags and per-module strictness: [tool.mypy] in pyproject.toml
