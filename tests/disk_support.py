"""A small real filesystem for disk-full tests: a tmpfs mounted for the test (root only)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``where``; why not, when it cannot be done here."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run mount: {exc}"
    if r.returncode != 0:
        return f"mounting a tmpfs is not permitted here (needs root): {r.stderr.strip()}"
    return None


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)
