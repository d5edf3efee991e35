"""Build hook: generate the gRPC door's protobuf classes and compile the Spark source's C decoder.

1. ``src/txmq/broker/grpc/pb/*.proto`` (txmq's own description of RocketMQ 5's
   ``apache.rocketmq.v2`` protocol) are compiled with grpcio-tools (pinned in
   ``[build-system] requires``) into ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` beside them.
2. ``src/txmq/spark/_columns.c`` is compiled into the extension module ``txmq.spark._ccolumns``
   (``_ccolumns`` + the interpreter's ``EXT_SUFFIX``, beside the source) with the compiler and
   link command of the building interpreter (``sysconfig``'s ``LDSHARED`` and ``CCSHARED``),
   ``-O2``, Python's headers and the system zlib (``-lz``); the wheel is then platform specific
   (``pure_python`` false, tags inferred). Without a compiler, Python's headers or zlib's, or with
   ``TXMQ_PURE_PYTHON=1`` at build time, the wheel is pure Python (a warning says so) and the
   source decodes with numpy (``txmq.spark._arrow``).

Generated files are git-ignored and added to wheels as artifacts; an editable install (``uv sync``)
runs the same hook and imports them from ``src/``. ``[tool.uv] cache-keys`` names the ``.proto``
files and the ``.c`` file, so ``uv sync`` / ``uv run`` rebuild after an edit.
"""

from __future__ import annotations

import importlib.resources
import os
import shlex
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO_DIR = "src/txmq/broker/grpc/pb"
EXTENSION_SOURCE = "src/txmq/spark/_columns.c"
EXTENSION_MODULE = "_ccolumns"
PURE_PYTHON_ENV = "TXMQ_PURE_PYTHON"
"""``1`` at build time: build no C extension (the same variable disables it at run time)."""


class TxmqBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":  # an sdist ships the .proto and .c files, not built code
            return
        self._generate_protos(build_data)
        self._build_extension(build_data, editable=version == "editable")

    def _generate_protos(self, build_data: dict[str, Any]) -> None:
        from grpc_tools import protoc

        root = Path(self.root)
        src = root / "src"
        protos = sorted((root / PROTO_DIR).glob("*.proto"))
        well_known = importlib.resources.files("grpc_tools") / "_proto"
        args = ["grpc_tools.protoc", f"-I{src}", f"-I{well_known}", f"--python_out={src}",
                f"--pyi_out={src}", f"--grpc_python_out={src}", *(str(p) for p in protos)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {', '.join(p.name for p in protos)}")
        build_data.setdefault("artifacts", []).append(f"/{PROTO_DIR}/*_pb2*.py*")

    def _build_extension(self, build_data: dict[str, Any], *, editable: bool) -> None:
        source = Path(self.root) / EXTENSION_SOURCE
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        target = source.with_name(EXTENSION_MODULE + suffix)
        if editable:  # an editable install imports from src/: leave no earlier build there
            target.unlink(missing_ok=True)
        if os.environ.get(PURE_PYTHON_ENV) == "1":
            self.app.display_warning(f"txmq: {PURE_PYTHON_ENV}=1, building without the C extension "
                                     "(the Spark source decodes with numpy)")
            return
        link = sysconfig.get_config_var("LDSHARED")
        if not link:
            self.app.display_warning("txmq: no C compiler known to this Python; building without "
                                     "the C extension (the Spark source decodes with numpy)")
            return
        command = [*shlex.split(link), *shlex.split(sysconfig.get_config_var("CCSHARED") or ""),
                   "-O2", "-DNDEBUG", f"-I{sysconfig.get_paths()['include']}", str(source),
                   "-o", str(target), "-lz"]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            self.app.display_warning(f"txmq: compiling {EXTENSION_SOURCE} failed, building without "
                                     f"the C extension (needs a C compiler, Python's and zlib's "
                                     f"headers): {detail.strip()[:2000]}")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data.setdefault("artifacts", []).append(f"/{EXTENSION_SOURCE.rsplit('/', 1)[0]}/"
                                                      f"{target.name}")
