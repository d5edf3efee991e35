"""The broker's OTLP export in-process (``txmq.broker._otlp``, extra ``otlp``): which lives get
spans (a valid, sampled ``traceparent`` only), what a discard's span says, and the OTLP JSON lines
of ``otlp_file``. The export with a broker process: tests/broker/test_tx_trace_processes.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from txmq.broker import BrokerConfig
from txmq.broker._otlp import OtlpExport
from txmq.errors import ConfigError
from txmq.protocol import TransactionLife, TransactionStep

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def _life(traceparent: str, tracestate: str = "") -> TransactionLife:
    return TransactionLife(half_offset=3, commit_log_offset=300, msg_id="M1", topic="orders",
                           producer_group="pg", client_id="c1", address="10.0.0.1:5001",
                           born_ms=1_000, stored_ms=1_001, traceparent=traceparent,
                           tracestate=tracestate)


def _export(tmp_path: Path, lives: list[TransactionLife], end: TransactionStep) -> list[dict[str, Any]]:
    out = tmp_path / "spans.jsonl"
    export = OtlpExport(BrokerConfig(otlp_file=str(out), broker_name="broker-x"))
    for life in lives:
        export.half_stored(life)
        check = TransactionStep(kind="check-back", time_ms=2_000, check_count=1, client_id="c2",
                                address="[::1]:7000")
        export.check_closed(life, check, None, 2_500)
        export.ended(life, end)
    export.shutdown()
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    for doc in docs:
        [rs] = doc["resourceSpans"]
        attrs = {a["key"]: a["value"]["stringValue"] for a in rs["resource"]["attributes"]
                 if "stringValue" in a["value"]}
        assert attrs["service.name"] == "txmq-broker"
        assert attrs["service.instance.id"] == "DefaultCluster/broker-x/0"
    return [span for doc in docs for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]
            for span in ss["spans"]]


def test_only_a_valid_sampled_traceparent_gets_spans(tmp_path: Path) -> None:
    end = TransactionStep(kind="end", time_ms=3_000, outcome="COMMIT", decided_by="producer",
                          client_id="c1", address="10.0.0.1:5001")
    spans = _export(tmp_path, [
        _life(f"00-{TRACE_ID}-b7ad6b7169203331-01", "vendor=x"),
        _life(f"00-{'1' * 32}-b7ad6b7169203331-00"),  # not sampled by the producer
        _life("00-not-a-traceparent"), _life("")], end)
    assert [(s["name"], s["traceId"], s["parentSpanId"]) for s in spans] == [
        ("half stored", TRACE_ID, "b7ad6b7169203331"), ("check-back", TRACE_ID, "b7ad6b7169203331"),
        ("end", TRACE_ID, "b7ad6b7169203331")]
    half, check, done = spans
    assert {s["traceState"] for s in spans} == {"vendor=x"}
    assert (half["startTimeUnixNano"], half["endTimeUnixNano"]) == ("1001000000", "1001000000")
    assert (check["startTimeUnixNano"], check["endTimeUnixNano"]) == ("2000000000", "2500000000")
    attrs = {a["key"]: a["value"] for a in check["attributes"]}
    assert attrs["txmq.transaction.answer"] == {"stringValue": "NONE"}
    assert attrs["txmq.transaction.check_count"] == {"intValue": "1"}
    assert attrs["network.peer.address"] == {"stringValue": "::1"}
    assert attrs["network.peer.port"] == {"intValue": "7000"}
    assert "status" not in done and done["kind"] == 2


def test_a_discard_s_end_span_is_an_error_with_the_reason(tmp_path: Path) -> None:
    end = TransactionStep(kind="end", time_ms=3_000, outcome="DISCARD", decided_by="check-back",
                          reason="no decision after 15 check-backs (transaction_check_max)")
    *_, done = _export(tmp_path, [_life(f"00-{TRACE_ID}-b7ad6b7169203331-01")], end)
    assert done["kind"] == 1  # INTERNAL: no request settled it
    assert done["status"] == {"code": 2, "message": end.reason}


def test_an_otlp_file_that_cannot_be_opened_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="otlp_file"):
        OtlpExport(BrokerConfig(otlp_file=str(tmp_path / "no-such-dir" / "spans.jsonl")))


@pytest.mark.parametrize(("config", "message"), [
    ({"otlp_file": "x.jsonl", "transaction_trace_max": 0}, "transaction_trace_max > 0"),
    ({"otlp_endpoint": "collector:4318"}, "not an http"),
    ({"transaction_trace_max": -1}, "must not be negative"),
])
def test_export_settings_are_checked(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        msgspec.convert(config, BrokerConfig).validate()
