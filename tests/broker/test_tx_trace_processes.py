"""The broker's leg of a transaction's trace with real processes (issue #28): a producer in a trace
sends a half and answers UNKNOWN, leaves, and a check-back to another producer of its group
commits. The broker records that life (GET_TRANSACTION_TRACE) and, with ``otlp_file``, writes
OTLP JSON spans into the producer's trace (with ``otlp_endpoint`` it posts them to an OTLP/HTTP
receiver, here a stdlib HTTP server decoding them); a broker without the ``otlp`` extra's modules starts,
and refuses the export with the command that installs them."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, ClassVar

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from txmq.client import Admin, LocalTransactionState, Message, MessageExt, TransactionProducer
from txmq.protocol import TransactionLife
from txmq.testing import BrokerProcess, run_broker, wait_until

WAIT_S = 30.0


class _Undecided:
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


class _Committed:
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def _traced_unknown_then_checked(b: BrokerProcess) -> tuple[str, str, str, str, TransactionLife]:
    """Producer A sends in a trace and answers UNKNOWN, then closes; producer B of the group
    answers the check-back COMMIT. Returns (msg id, trace id, A's client id, B's, the life)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracer = provider.get_tracer("test")
    with TransactionProducer("trace-pg", b.endpoints, _Committed()) as checker:
        with TransactionProducer("trace-pg", b.endpoints, _Undecided()) as sender:
            with tracer.start_as_current_span("place order", kind=SpanKind.PRODUCER) as span:
                carrier: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(carrier)
                sent = sender.send_message_in_transaction(Message(
                    topic="orders", body=b'{"order": 7}', keys="order-7", properties=carrier))
            trace_id = format(span.get_span_context().trace_id, "032x")
            sender_id = sender.client_id
        with Admin(b.endpoints) as adm:
            wait_until(lambda: adm.query_transaction(f"half:{sent.half_offset}")["state"]
                       == "COMMIT", WAIT_S)
            [life] = adm.transaction_lives(sent.msg_id)
            assert adm.transaction_lives(trace_id=trace_id) == [life]
        return sent.msg_id, trace_id, sender_id, checker.client_id, life


def _spans(path: Path) -> list[dict[str, Any]]:
    """Every span of an OTLP JSON lines file."""
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            service = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}["service.name"]
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
                    out.append({**span, "attrs": attrs, "service": service["stringValue"]})
    return out


def test_the_broker_s_leg_joins_the_producer_s_trace_in_its_otlp_file(tmp_path: Path) -> None:
    spans_file = tmp_path / "broker-spans.jsonl"
    # the sender leaves well before the first check-back (2 s), which goes to the checker
    with run_broker(tmp_path / "broker", topics={"orders": 2}, transaction_timeout_ms=2_000,
                    transaction_check_interval_ms=1_000, otlp_file=str(spans_file)) as b:
        msg_id, trace_id, sender_id, checker_id, life = _traced_unknown_then_checked(b)
    # the life: stored from A, A's UNKNOWN, a check-back to B answered COMMIT, the end by B
    assert (life.msg_id, life.topic, life.producer_group, life.client_id) == (
        msg_id, "orders", "trace-pg", sender_id)
    assert life.traceparent.split("-")[1] == trace_id and life.address.startswith("127.0.0.1:")
    assert [(s.kind, s.client_id, s.answer, s.outcome, s.decided_by) for s in life.steps] == [
        ("answer", sender_id, "UNKNOWN", "", ""),
        ("check-back", checker_id, "", "", ""),
        ("answer", checker_id, "COMMIT", "", ""),
        ("end", checker_id, "", "COMMIT", "check-back")]
    check, answer = life.steps[1], life.steps[2]
    assert check.check_count == answer.check_count == 1 and answer.sent_ms == check.time_ms
    assert life.stored_ms <= life.steps[0].time_ms <= check.time_ms <= answer.time_ms
    # the spans: in the producer's trace, children of the span its traceparent names
    parent = life.traceparent.split("-")[2]
    spans = _spans(spans_file)
    assert sorted(s["name"] for s in spans) == ["check-back", "end", "half stored"]
    assert {(s["traceId"], s.get("parentSpanId"), s["service"]) for s in spans} == {
        (trace_id, parent, "txmq-broker")}
    by_name = {s["name"]: s for s in spans}
    # OTLP SpanKind: SERVER 2, CLIENT 3; flags: the parent is remote (0x100 | 0x200)
    assert [(by_name[n]["kind"], by_name[n]["flags"]) for n in ("half stored", "check-back", "end")
            ] == [(2, 0x300), (3, 0x300), (2, 0x300)]
    for s in spans:
        assert s["attrs"]["messaging.system"] == "rocketmq"
        assert s["attrs"]["messaging.destination.name"] == "orders"
        assert s["attrs"]["messaging.rocketmq.client_group"] == "trace-pg"
        assert s["attrs"]["messaging.message.id"] == msg_id
    assert by_name["half stored"]["attrs"]["messaging.client.id"] == sender_id
    cb = by_name["check-back"]["attrs"]
    assert (cb["txmq.transaction.check_count"], cb["txmq.transaction.answer"],
            cb["txmq.transaction.producer_client_id"], cb["txmq.transaction.answered_by"]) == (
        "1", "COMMIT", checker_id, checker_id)  # (OTLP JSON writes int64 values as strings)
    assert int(by_name["check-back"]["startTimeUnixNano"]) == check.time_ms * 1_000_000
    assert int(by_name["check-back"]["endTimeUnixNano"]) == answer.time_ms * 1_000_000
    end = by_name["end"]["attrs"]
    assert (end["txmq.transaction.outcome"], end["txmq.transaction.decided_by"],
            end["messaging.client.id"]) == ("COMMIT", "check-back", checker_id)


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each POSTed ExportTraceServiceRequest (protobuf)."""

    received: ClassVar[list[ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        self.received.append(req)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_broker_posts_its_spans_to_an_otlp_http_endpoint(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    try:
        with run_broker(tmp_path / "broker", topics={"orders": 1}, otlp_endpoint=endpoint) as b, \
                TransactionProducer("http-pg", b.endpoints, _Committed()) as p:
            p.send_message_in_transaction(Message(topic="orders", body=b"x",
                                                  properties={"traceparent": traceparent}))
            wait_until(lambda: len(_http_spans()) == 2, WAIT_S)  # within the export delay
    finally:
        server.shutdown()
    assert sorted((s.name, s.trace_id.hex(), s.parent_span_id.hex()) for s in _http_spans()) == [
        ("end", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        ("half stored", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")]


def _http_spans() -> list[Any]:
    return [span for req in _Collector.received for rs in req.resource_spans
            for ss in rs.scope_spans for span in ss.spans]


def test_a_broker_without_the_otlp_modules_starts_and_refuses_only_the_export(tmp_path: Path
                                                                              ) -> None:
    """The ``otlp`` extra's modules hidden from a real broker process (a meta path hook that
    finds no ``opentelemetry``): it starts without export configured, and with ``otlp_file`` it
    exits 2 naming ``pip install 'txmq[otlp]'``."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class _Hide:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, _Hide())
    """))
    env = {"PYTHONPATH": str(hide)}
    bp = BrokerProcess(tmp_path / "plain", {"topics": {"orders": 1}}, env=env)
    bp.start()
    try:
        with Admin(bp.endpoints) as adm:
            assert adm.transaction_stats()["PENDING"] == 0
    finally:
        bp.stop()
    (tmp_path / "otlp.toml").write_text(f'otlp_file = "{tmp_path / "spans.jsonl"}"\n')
    proc = subprocess.run([sys.executable, "-m", "txmq", "broker", "--config",
                           str(tmp_path / "otlp.toml"), "--port", "0", "--data-dir",
                           str(tmp_path / "otlp-data")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})
    assert proc.returncode == 2, proc.stderr
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "OTLP export" in out and "pip install 'txmq[otlp]'" in out, out
