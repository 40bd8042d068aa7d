"""The documentation stands alone: every relative link in README.md, docs/ and examples/
resolves to a file of the repository (and a #fragment to a heading there), nothing points
outside the repository at the project workspace, and the README stays short."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_DIRS = {".git", ".venv", "var", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache"}
# Files of the project workspace that a clone does not have: naming one sends a reader nowhere.
# (Spelled in pieces so that this file does not name them itself.)
WORKSPACE_ONLY = [
    "../" + "shared",
    "shared" + "/DESIGN",
    "shared" + "/reference",
    "DESIGN" + ".md",
    "spark" + "-notes.md",
    "openmq" + "-facts.md",
    "stomp" + "-notes.md",
    "style" + "-examples.md",
    "bridge" + "-services.txt",
]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in links(doc):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            broken.append(f"{target}: no such file in the repository")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_docs_are_linked_from_the_readme() -> None:
    readme = set(links(ROOT / "README.md"))
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md's Documentation list lacks {missing}"


def repository_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found.extend(Path(folder, name) for name in files)
    return found


def test_nothing_points_at_the_project_workspace() -> None:
    here = Path(__file__).resolve()
    files = repository_files()
    present = {path.name for path in files}
    found = []
    for path in files:
        if path == here or path.stat().st_size > 2_000_000:
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        text = data.decode("utf-8", "replace")
        for needle in WORKSPACE_ONLY:
            if needle in text and Path(needle).name not in present:
                line = text[: text.index(needle)].count("\n") + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {needle}")
    assert not found, "files outside the repository are named (point at docs/ instead): " + ", ".join(found)


def test_the_readme_stays_short() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Quick start" in text and "## Documentation" in text
    lines = text.count("\n")
    assert lines <= 100, f"README.md has {lines} lines: move the detail to docs/ (the README is a summary)"
