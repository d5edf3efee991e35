"""Quarantine: where recovery moves what it cannot use instead of deleting it or refusing to start.

``<data dir>/quarantine/<n>/<path relative to the data dir>``: one numbered directory per store
opening (or repair) that quarantined something, ``n`` one more than the highest there. Each move is
logged with the reason; an operator inspects and deletes these directories.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from txmq import limits

__all__ = ["Quarantine"]

log = logging.getLogger("txmq.store")


class Quarantine:
    """Moves files and directories of the data directory ``root`` aside (see the module docstring).

    Attributes:
        moved: ``(original path, quarantined path, reason)`` of everything moved so far.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dir: Path | None = None
        self.moved: list[tuple[Path, Path, str]] = []

    def _target_dir(self) -> Path:
        if self._dir is None:
            base = self.root / limits.QUARANTINE_DIR
            base.mkdir(parents=True, exist_ok=True)
            taken = [int(p.name) for p in base.iterdir() if p.name.isdigit()]
            self._dir = base / f"{max(taken, default=0) + 1:06d}"
            self._dir.mkdir()
        return self._dir

    def _dest(self, path: Path) -> Path:
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            rel = Path(path.name)
        dest = self._target_dir() / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest

    def put(self, path: Path, reason: str) -> Path:
        """Move ``path`` (file or directory) into the quarantine; log and return where it went.

        Raises OSError (nothing moved)."""
        try:
            dest = self._dest(path)
            os.replace(path, dest) if not dest.exists() else shutil.move(path, dest / path.name)
        except OSError as exc:  # no room for the quarantine directory (a full disk): set it aside
            dest = path.with_name(f"{path.name}.quarantined-{len(self.moved) + 1}")
            os.replace(path, dest)
            reason = f"{reason} (kept next to it: {exc})"
        self.moved.append((path, dest, reason))
        log.warning("quarantined %s to %s: %s", path, dest, reason)
        return dest

    def put_bytes(self, path: Path, start: int, reason: str) -> Path:
        """Copy ``path`` from byte ``start`` to its end into the quarantine (before the caller cuts
        it there); log and return the copy. Raises OSError."""
        dest = self._dest(path).with_name(f"{path.name}.from-{start}")
        with open(path, "rb") as src, open(dest, "wb") as out:
            src.seek(start)
            shutil.copyfileobj(src, out)
            out.flush()
            os.fsync(out.fileno())
        self.moved.append((path, dest, reason))
        log.warning("quarantined bytes %d.. of %s to %s: %s", start, path, dest, reason)
        return dest
