"""Helpers of the demo tests (imported by name: pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path

from txmq.demo._faults import Fault, fault_of
from txmq.demo.traces import read_spans


def assert_example_trace(r: dict[str, object], stdout: str, system: str) -> None:
    """The run exported its spans, and the report names an order whose one trace holds every leg:
    the transactional send, the check-back, the ledger's refusals and retries, the ROLLBACK event
    (put, relay over ``system``), the compensation; ``stdout`` has the command that shows it."""
    example = r["trace_example"]
    assert isinstance(example, dict) and isinstance(r["trace_file"], str)
    assert fault_of(example["order_key"]) is Fault.UNKNOWN_REJECT
    spans = list(read_spans([Path(r["trace_file"])], example["trace_id"]))
    names = {s.name.split(" ")[0] for s in spans}
    assert {"place", "send_message_in_transaction", "send_half", "execute_local_transaction",
            "end_transaction", "check_transaction_state", "process", "apply", "retry",
            "put_message", "relay", "compensate"} <= names, names
    (relay,) = [s for s in spans if s.name.startswith("relay ")]
    assert relay.attributes["messaging.system"] == system
    assert {s.service for s in spans} == {"order-service", "ledger", "order-service-compensation"}
    assert example["command"] in stdout
