"""Protobuf and gRPC classes of ``apache.rocketmq.v2``, generated at build time from the
``.proto`` files beside this file (see ``hatch_build.py``): ``definition_pb2``, ``service_pb2``,
``service_pb2_grpc``."""
