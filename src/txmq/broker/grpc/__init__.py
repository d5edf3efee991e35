"""The broker's gRPC door: RocketMQ 5's ``apache.rocketmq.v2.MessagingService`` (the protocol of
every 5.x client) served by a grpc.aio server in the broker process, over the same broker core as
the remoting door (see docs/grpc.md).

- :class:`GrpcCore`: sans-IO, protobuf requests → broker calls → responses.
- :class:`GrpcDoor`: the asyncio shell the broker's server starts when ``grpc_port`` is set.
- ``pb``: the protocol classes, generated at build time from txmq's own ``.proto`` files.
"""

from txmq.extras import require_extra as _require_extra

_require_extra("grpc", "the gRPC door (txmq.broker.grpc)", "grpc", "google.protobuf")

from txmq.broker.grpc._convert import GrpcError, Result
from txmq.broker.grpc._core import GRPC_CONN_BASE, ClientState, GrpcCore, is_grpc_conn
from txmq.broker.grpc._server import GrpcDoor, endpoints_of

__all__ = ["GRPC_CONN_BASE", "ClientState", "GrpcCore", "GrpcDoor", "GrpcError", "Result",
           "endpoints_of", "is_grpc_conn"]
