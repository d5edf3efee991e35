"""A separate Python environment holding a third-party RocketMQ client: the RocketMQ C++ core.

The conformance tests drive txmq with a client txmq did not write: ``rocketmq-client-python`` (the
Apache RocketMQ C++ client's ctypes wrapper, remoting protocol). Its PyPI sdist ships no native library
(importing it raises ``ImportError: rocketmq dynamic library not found``), so :func:`ensure_env` takes
``librocketmq.so`` ("CPP CORE VERSION: 2.1.0_cvs") from the ``rocketmq-python-cvs`` wheel and puts it
beside the installed ``rocketmq`` package, where the wrapper's ``ffi.py`` looks first.

The environment is its own virtual environment (never txmq's: neither package is a txmq dependency),
made once and cached under ``$TXMQ_CACHE_DIR`` (default ``$XDG_CACHE_HOME/txmq``, else
``~/.cache/txmq``) in a directory named after the pinned versions. Building needs PyPI and either ``uv``
on ``PATH`` or ``pip`` in this interpreter. The library is an x86-64 Linux ELF that needs only
``libstdc++.so.6``, ``libgcc_s.so.1``, ``libz.so.1``, ``libpthread``, ``libm`` and ``libc`` (Debian
packages ``libstdc++6`` and ``zlib1g``, present on every Debian/Ubuntu image).

Use from a pytest session fixture (``python = ensure_env()``) or from a shell, which prints the path of
the environment's python, building it first if needed::

    PYTHONPATH=tests python -m client_envs.rocketmq_cpp
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from client_envs._venv import cache_root, locked, run_installer, venv_python
from txmq.errors import LocalError

__all__ = [
    "CLIENT_PACKAGE",
    "CLIENT_VERSION",
    "CORE_PACKAGE",
    "CORE_VERSION",
    "LIBRARY_NAME",
    "CppClientUnavailable",
    "cache_root",
    "ensure_env",
    "env_dir",
]

CLIENT_PACKAGE = "rocketmq-client-python"
CLIENT_VERSION = "2.0.0"
CORE_PACKAGE = "rocketmq-python-cvs"  # used only as the source of the native library
CORE_VERSION = "2.1.0.3"  # its librocketmq.so reports "CPP CORE VERSION: 2.1.0_cvs"
LIBRARY_NAME = "librocketmq.so"
INSTALL_TIMEOUT_S = 600.0  # one installer call: a venv, a PyPI download, an sdist build
_READY_MARKER = ".txmq-ready"
_SUPPORTED_MACHINES = frozenset({"x86_64", "amd64"})


class CppClientUnavailable(LocalError):
    """The C++-core client environment cannot be built here: no PyPI, no installer, an unsupported
    platform, or a native library that does not load. The message carries the installer's output."""

    code = "CPP_CLIENT_UNAVAILABLE"


def env_dir(root: Path | None = None) -> Path:
    """The environment's directory: one per pinned version pair and Python minor version."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    return (root or cache_root()) / f"rocketmq-cpp-{CLIENT_VERSION}-core-{CORE_VERSION}-{py}"


def _run(cmd: list[str], what: str) -> None:
    run_installer(cmd, what, CppClientUnavailable, INSTALL_TIMEOUT_S)


def _site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60,
                             check=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise CppClientUnavailable(f"{python} cannot report its site-packages: {e}") from e
    return Path(out.stdout.strip())


def _install(venv: Path, scratch: Path) -> None:
    """Make the venv, install the wrapper, unpack the core's wheel into ``scratch``."""
    client = f"{CLIENT_PACKAGE}=={CLIENT_VERSION}"
    core = f"{CORE_PACKAGE}=={CORE_VERSION}"
    uv = shutil.which("uv")
    if uv:
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], "uv venv")
        py = str(venv_python(venv))
        _run([uv, "pip", "install", "--quiet", "--python", py, client], f"installing {client}")
        _run([uv, "pip", "install", "--quiet", "--python", py, "--no-deps", "--target", str(scratch), core],
             f"unpacking {core}")
        return
    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
    pip = [str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    _run([*pip, "install", client], f"installing {client}")
    _run([*pip, "install", "--no-deps", "--target", str(scratch), core], f"unpacking {core}")


def _check_platform() -> None:
    if sys.platform != "linux" or platform.machine().lower() not in _SUPPORTED_MACHINES:
        raise CppClientUnavailable(
            f"{CORE_PACKAGE} {CORE_VERSION} ships {LIBRARY_NAME} for x86-64 Linux only, "
            f"not {sys.platform}/{platform.machine()}")


def _verify(python: Path) -> None:
    _run([str(python), "-c", "import rocketmq.client"], f"loading {LIBRARY_NAME} through {CLIENT_PACKAGE}")


def ensure_env(root: Path | None = None) -> Path:
    """Build (once; cached, idempotent, safe across processes) and return the environment's python.

    Args:
        root: the cache directory (default :func:`cache_root`).

    Returns:
        The path of the environment's ``python``, which can ``import rocketmq.client``.

    Raises:
        CppClientUnavailable: the platform is not x86-64 Linux, the installer or PyPI is unreachable,
            or the native library does not load (a missing system library is named in the message).
    """
    _check_platform()
    venv = env_dir(root)
    with locked(venv.with_name(venv.name + ".lock")):
        if (venv / _READY_MARKER).exists():
            return venv_python(venv)
        shutil.rmtree(venv, ignore_errors=True)  # a build interrupted earlier
        with tempfile.TemporaryDirectory(prefix="txmq-rocketmq-core-") as scratch:
            _install(venv, Path(scratch))
            lib = Path(scratch) / "rocketmq" / LIBRARY_NAME
            if not lib.is_file():
                raise CppClientUnavailable(f"{CORE_PACKAGE} {CORE_VERSION} holds no rocketmq/{LIBRARY_NAME}")
            shutil.copy2(lib, _site_packages(venv_python(venv)) / "rocketmq" / LIBRARY_NAME)
        _verify(venv_python(venv))
        pins = f"{CLIENT_PACKAGE}=={CLIENT_VERSION}\n{CORE_PACKAGE}=={CORE_VERSION}\n"
        (venv / _READY_MARKER).write_text(pins)
    return venv_python(venv)


def main() -> int:
    """Print the environment's python path, building it first; exit status 1 if it cannot be built."""
    try:
        print(ensure_env())
    except CppClientUnavailable as e:
        print(f"rocketmq C++ client environment unavailable: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
