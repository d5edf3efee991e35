"""What the third-party client harnesses share: the cache directory, the interpreter of a venv, an
installer call, and a lock so that parallel test sessions build an environment once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from txmq.errors import LocalError

__all__ = ["cache_root", "locked", "run_installer", "venv_python"]


def cache_root() -> Path:
    """Where client environments are cached: ``$TXMQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/txmq``,
    else ``~/.cache/txmq``."""
    if os.environ.get("TXMQ_CACHE_DIR"):
        return Path(os.environ["TXMQ_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "txmq"


def venv_python(venv: Path) -> Path:
    """The interpreter of the virtual environment at ``venv``."""
    return venv / "bin" / "python"


def run_installer(cmd: list[str], what: str, error: type[LocalError], timeout_s: float) -> None:
    """Run one installer step (``what``, for the message); raises ``error`` with the tail of its
    output when it cannot start, times out after ``timeout_s`` seconds, or exits non-zero."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise error(f"{what}: {e}") from e
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip()[-2000:]
        raise error(f"{what} failed ({' '.join(cmd)}):\n{out}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``: parallel test sessions build the environment once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
