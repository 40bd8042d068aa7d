"""What the spark.log tests share: the bound they set and the check of the files it made."""

from __future__ import annotations

from pathlib import Path

LIMIT = 64 * 1024
FILES = 10


def files_of(path: Path) -> list[Path]:
    """spark.log and the files it rolled over to, oldest first."""
    older = sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:]))
    return [*older, path]


def check_files(path: Path) -> list[str]:
    """FILES files of at most LIMIT bytes each (0600, in a 0700 folder); their texts, oldest
    first."""
    files = files_of(path)
    assert len(files) == FILES, [p.name for p in files]
    assert path.parent.stat().st_mode & 0o777 == 0o700
    for file in files:
        assert file.stat().st_mode & 0o777 == 0o600, file
        assert 0 < file.stat().st_size <= LIMIT, (file, file.stat().st_size)
    return [f.read_text() for f in files]
