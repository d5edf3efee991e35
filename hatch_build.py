"""Build hook: generate the gRPC door's protobuf classes and compile the C extensions.

1. ``src/txmq/broker/grpc/pb/*.proto`` (txmq's own description of RocketMQ 5's
   ``apache.rocketmq.v2`` protocol) are compiled with grpcio-tools (pinned in
   ``[build-system] requires``) into ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` beside them.
2. The C sources of :data:`EXTENSIONS` are compiled into extension modules beside them
   (``src/txmq/spark/_columns.c`` → ``txmq.spark._ccolumns``, the Spark source's decoder of pull
   replies; ``src/txmq/store/_cqruns.c`` → ``txmq.store._ccqruns``, the broker's walk over consume
   queue entries for a raw pull), the module name + the interpreter's ``EXT_SUFFIX``, with the
   compiler and link command of the building interpreter (``sysconfig``'s ``LDSHARED`` and
   ``CCSHARED``), ``-O2``, Python's headers and the system zlib (``-lz``); the wheel is then
   platform specific (``pure_python`` false, tags inferred). Without a compiler, Python's headers
   or zlib's, or with ``TXMQ_PURE_PYTHON=1`` at build time, the wheel is pure Python (a warning
   says so): the Spark source decodes with numpy (``txmq.spark._arrow``) and the broker walks the
   entries in Python (``txmq.store._raw_read``), with the same results.

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
EXTENSIONS = (("src/txmq/spark/_columns.c", "_ccolumns"), ("src/txmq/store/_cqruns.c", "_ccqruns"))
"""(C source, module name) of each extension, built beside its source."""
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
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        targets = [(Path(self.root) / src).with_name(module + suffix) for src, module in EXTENSIONS]
        if editable:  # an editable install imports from src/: leave no earlier build there
            for target in targets:
                target.unlink(missing_ok=True)
        if os.environ.get(PURE_PYTHON_ENV) == "1":
            self.app.display_warning(f"txmq: {PURE_PYTHON_ENV}=1, building without the C extensions "
                                     "(the Spark source decodes with numpy)")
            return
        link = sysconfig.get_config_var("LDSHARED")
        if not link:
            self.app.display_warning("txmq: no C compiler known to this Python; building without "
                                     "the C extensions (the Spark source decodes with numpy)")
            return
        for (src, _), target in zip(EXTENSIONS, targets, strict=True):
            command = [*shlex.split(link), *shlex.split(sysconfig.get_config_var("CCSHARED") or ""),
                       "-O2", "-DNDEBUG", f"-I{sysconfig.get_paths()['include']}",
                       str(Path(self.root) / src), "-o", str(target), "-lz"]
            try:
                subprocess.run(command, check=True, capture_output=True, text=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                for built in targets:
                    built.unlink(missing_ok=True)
                self.app.display_warning(f"txmq: compiling {src} failed, building without the C "
                                         f"extensions (needs a C compiler, Python's and zlib's "
                                         f"headers): {detail.strip()[:2000]}")
                return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for (src, _), target in zip(EXTENSIONS, targets, strict=True):
            build_data.setdefault("artifacts", []).append(f"/{src.rsplit('/', 1)[0]}/{target.name}")
