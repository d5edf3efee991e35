"""The package's C extensions, loaded where they were built: each has a pure-Python path giving
the same results, used when the extension is missing (a wheel built without a compiler, or with
``TXMQ_PURE_PYTHON=1``: see ``hatch_build.py``) or disabled at run time."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["PURE_PYTHON_ENV", "load_extension"]

PURE_PYTHON_ENV = "TXMQ_PURE_PYTHON"
"""Set to ``1`` (before the module using an extension is imported, or at build time for the
wheel) to use no C extension."""


def load_extension(name: str) -> ModuleType | None:
    """The extension module ``name`` (e.g. ``"txmq.store._ccqruns"``), or None when it is not
    built or :data:`PURE_PYTHON_ENV` is ``1``."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
