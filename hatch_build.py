"""Build hook: generate the gRPC door's protobuf and gRPC classes from ``*.proto`` at build time.

``src/txmq/broker/grpc/pb/*.proto`` (txmq's own description of RocketMQ 5's
``apache.rocketmq.v2`` protocol) are compiled with grpcio-tools (pinned in
``[build-system] requires``) into ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` beside them.
The generated files are git-ignored and added to wheels as artifacts; ``[tool.uv] cache-keys``
names the ``.proto`` files, so ``uv sync`` / ``uv run`` rebuild after an edit.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO_DIR = "src/txmq/broker/grpc/pb"


class ProtoBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":  # an sdist ships the .proto files, not generated code
            return
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
