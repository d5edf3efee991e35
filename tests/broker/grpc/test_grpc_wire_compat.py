"""txmq's generated protocol classes against those shipped in PyPI rocketmq-python-client 5.1.2:
the same messages, fields, numbers, types and enum values, and messages serialized by the client's
classes parse and re-serialize byte-identically with txmq's. Runs in the client's own environment
(``client_envs.rocketmq_grpc``, the conformance harness); skipped where it cannot be built unless
``TXMQ_REQUIRE_ROCKETMQ_GRPC=1``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from client_envs.rocketmq_grpc import GrpcClientUnavailable, ensure_env
from txmq.broker.grpc.pb import definition_pb2, service_pb2

REQUIREMENTS = Path(__file__).parents[2] / "conformance" / "clients" / "rocketmq_grpc_requirements.txt"

_DUMP = r'''
import base64, json, sys
from google.protobuf import descriptor_pb2
from rocketmq.grpc_protocol import definition_pb2 as d, service_pb2 as s

def shape(fd):
    out = {}
    def walk(m, prefix):
        if m.GetOptions().map_entry:
            return
        out[prefix + m.name] = sorted([f.name, f.number, f.type, f.is_repeated,
                                       (f.message_type or f.enum_type).full_name
                                       if (f.message_type or f.enum_type) else ""] for f in m.fields)
        for n in m.nested_types:
            walk(n, prefix + m.name + ".")
        for e in m.enum_types:
            out[prefix + m.name + "." + e.name] = sorted([v.name, v.number] for v in e.values)
    for m in fd.message_types_by_name.values():
        walk(m, "")
    for e in fd.enum_types_by_name.values():
        out[e.name] = sorted([v.name, v.number] for v in e.values)
    for sv in fd.services_by_name.values():
        out["service " + sv.full_name] = sorted([x.name, x.input_type.full_name, x.output_type.full_name,
                                                 x.client_streaming, x.server_streaming] for x in sv.methods)
    return out

m = d.Message(topic=d.Resource(name="t", resource_namespace="ns"), body=b"hello",
              user_properties={"k": "v"}, system_properties=d.SystemProperties(
    tag="A", keys=["k1", "k2"], message_id="01AB", body_digest=d.Digest(type=d.MD5, checksum="X"),
    body_encoding=d.IDENTITY, message_type=d.TRANSACTION, born_host="h", store_host="s",
    receipt_handle="rh", queue_id=3, queue_offset=9, delivery_attempt=2, message_group="g",
    trace_context="tc", lite_topic="lt", priority=5,
    dead_letter_queue=d.DeadLetterQueue(topic="x", message_id="y")))
m.system_properties.born_timestamp.seconds = 1700000000
m.system_properties.delivery_timestamp.seconds = 1700000005
samples = {
    "SendMessageRequest": s.SendMessageRequest(messages=[m]),
    "ReceiveMessageResponse": s.ReceiveMessageResponse(message=m),
    "TelemetryCommand": s.TelemetryCommand(status=d.Status(code=d.OK, message="ok"), settings=d.Settings(
        client_type=d.PRODUCER, publishing=d.Publishing(topics=[d.Resource(name="t")],
        max_body_size=4194304, validate_message_type=True), backoff_policy=d.RetryPolicy(
        max_attempts=3, exponential_backoff=d.ExponentialBackoff(multiplier=2.0)),
        user_agent=d.UA(language=d.PYTHON, version="5.1.2"), metric=d.Metric(on=False))),
    "EndTransactionRequest": s.EndTransactionRequest(topic=d.Resource(name="t"), message_id="m",
        transaction_id="tx", resolution=d.ROLLBACK, source=d.SOURCE_SERVER_CHECK),
}
samples["RecoverOrphaned"] = s.TelemetryCommand(
    recover_orphaned_transaction_command=s.RecoverOrphanedTransactionCommand(message=m, transaction_id="tx"))
print(json.dumps({
    "shape": {**shape(d.DESCRIPTOR), **shape(s.DESCRIPTOR)},
    "samples": {k: [type(v).__name__, base64.b64encode(v.SerializeToString(deterministic=True)).decode()]
                for k, v in samples.items()},
}))
'''


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    try:
        python = ensure_env(REQUIREMENTS)
    except GrpcClientUnavailable as exc:  # no PyPI, or no wheel for this platform: skip unless required
        if os.environ.get("TXMQ_REQUIRE_ROCKETMQ_GRPC") == "1":
            raise
        pytest.skip(f"the official client's environment is not available: {exc}")
    home = tmp_path_factory.mktemp("client-home")
    out = subprocess.run([str(python), "-c", _DUMP], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(home), "PYTHONPATH": ""}, check=True)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def _shape(fd: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(m: Any, prefix: str) -> None:
        if m.GetOptions().map_entry:
            return
        out[prefix + m.name] = sorted(
            [f.name, f.number, f.type, f.is_repeated,
             (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else ""]
            for f in m.fields)
        for n in m.nested_types:
            walk(n, prefix + m.name + ".")
        for e in m.enum_types:
            out[prefix + m.name + "." + e.name] = sorted([v.name, v.number] for v in e.values)
    for m in fd.message_types_by_name.values():
        walk(m, "")
    for e in fd.enum_types_by_name.values():
        out[e.name] = sorted([v.name, v.number] for v in e.values)
    for sv in fd.services_by_name.values():
        out["service " + sv.full_name] = sorted(
            [x.name, x.input_type.full_name, x.output_type.full_name, x.client_streaming,
             x.server_streaming] for x in sv.methods)
    return out


def test_descriptors_match_the_official_client(theirs: dict[str, Any]) -> None:
    ours = json.loads(json.dumps({**_shape(definition_pb2.DESCRIPTOR), **_shape(service_pb2.DESCRIPTOR)}))
    assert ours == theirs["shape"]


def test_their_bytes_are_our_messages(theirs: dict[str, Any]) -> None:
    for name, (cls_name, b64) in theirs["samples"].items():
        data = base64.b64decode(b64)
        msg = getattr(service_pb2, cls_name).FromString(data)
        msg.DiscardUnknownFields()  # recursive: a field txmq does not know would vanish here
        assert msg.SerializeToString(deterministic=True) == data, name
