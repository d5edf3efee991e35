"""``/metrics`` of a real broker process under real traffic (issue 15 item 3): RocketMQ 5's names
and labels, values that match what was sent and consumed, and every metric the Grafana dashboard in
``docs/grafana`` queries present in a scrape."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from txmq.client import (
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    TransactionProducer,
)
from txmq.testing import BrokerProcess, free_port, run_broker, wait_until

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "txmq-dashboard.json"
TOPIC, TX_TOPIC, GROUP = "metrics-t", "metrics-tx", "metrics-g"
NORMAL, DELAYED = 6, 2


class Broker:
    def __init__(self, proc: BrokerProcess, metrics_port: int) -> None:
        self.proc, self.metrics_port = proc, metrics_port

    def scrape(self) -> dict[str, Any]:
        """Families by name, and every sample as ``samples[(name, frozenset(labels))]``."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=15) as r:
            text = r.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for f in families.values():
            for s in f.samples:
                samples[(s.name, frozenset(s.labels.items()))] = s.value
        return {"families": families, "samples": samples}


def value(scrape: dict[str, Any], name: str, **labels: str) -> float:
    """The one sample ``name`` whose labels include ``labels`` (0 if none)."""
    want = set(labels.items())
    found = [v for (n, ls), v in scrape["samples"].items() if n == name and want <= ls]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else 0.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    port = free_port()
    topics = {TOPIC: 2, TX_TOPIC: 1, "metrics-pending": 1}
    with run_broker(tmp_path_factory.mktemp("metrics-broker"), topics=topics, metrics_port=port,
                    message_delay_level="100ms 200ms") as b:
        yield Broker(b, port)


class _Decide:
    """Commits bodies starting with ``commit``, rolls back the rest."""

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return (LocalTransactionState.COMMIT_MESSAGE if msg.body.startswith(b"commit")
                else LocalTransactionState.ROLLBACK_MESSAGE)

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return self.execute_local_transaction(msg, None)


def _pull_all(pc: PullConsumer, topic: str, start: dict[int, int], limit: int) -> list[MessageExt]:
    """Up to ``limit`` messages from each queue's ``start`` offset, committing what was pulled."""
    got: list[MessageExt] = []
    for qid in range(2):
        msgs = pc.pull(topic, qid, start.get(qid, 0), limit).messages
        if msgs:
            start[qid] = msgs[-1].queue_offset + 1
            pc.commit_offset(topic, qid, start[qid])
        got += msgs
    return got


def test_traffic_lag_transactions_and_store_match_what_was_done(broker: Broker) -> None:
    b = broker.proc
    with Producer("metrics-p", b.endpoints) as p:
        at = [p.send(Message(topic=TOPIC, body=b"n%02d" % i + b"." * 100 * i)).commit_log_offset
              for i in range(NORMAL)]
        at += [p.send(Message(topic=TOPIC, body=b"d%02d" % i), delay_level=1).commit_log_offset
               for i in range(DELAYED)]
    with TransactionProducer("metrics-txp", b.endpoints, _Decide()) as tp:
        tp.send_message_in_transaction(Message(topic=TX_TOPIC, body=b"commit-1"))
        tp.send_message_in_transaction(Message(topic=TX_TOPIC, body=b"rollback-1"))
    total = NORMAL + DELAYED
    with PullConsumer(b.endpoints, GROUP) as pc:
        wait_until(lambda: sum(pc.max_offset(TOPIC, q) for q in range(2)) == total, timeout_s=15)
        for q in range(2):
            pc.commit_offset(TOPIC, q, 0)  # the group starts at the beginning: all of it is lag
        s = broker.scrape()
        assert value(s, "rocketmq_consumer_lag_messages", consumer_group=GROUP, topic=TOPIC) == total
        assert value(s, "rocketmq_consumer_lag_latency", consumer_group=GROUP, topic=TOPIC) > 0
        offsets: dict[int, int] = {}
        first = _pull_all(pc, TOPIC, offsets, 2)
        s = broker.scrape()
        assert value(s, "rocketmq_consumer_lag_messages", consumer_group=GROUP,
                     topic=TOPIC) == total - len(first)
        rest = _pull_all(pc, TOPIC, offsets, 32)
    pulled = first + rest
    assert len(pulled) == total
    s = broker.scrape()
    lbl = {"consumer_group": GROUP, "topic": TOPIC}
    assert value(s, "rocketmq_consumer_lag_messages", **lbl) == 0
    assert value(s, "rocketmq_consumer_inflight_messages", **lbl) == 0
    assert value(s, "rocketmq_consumer_ready_messages", **lbl) == 0
    # in: per topic and message type, bytes as stored in the commit log (the normal messages
    # were stored back to back, then the first delay message's schedule copy)
    normal = {"topic": TOPIC, "message_type": "normal", "is_system": "false"}
    assert value(s, "rocketmq_messages_in_total", **normal) == NORMAL
    assert value(s, "rocketmq_throughput_in_total", **normal) == at[NORMAL] - at[0]
    assert value(s, "rocketmq_messages_in_total", topic=TOPIC, message_type="delay") == DELAYED
    assert value(s, "rocketmq_messages_in_total", topic=TX_TOPIC, message_type="transaction") == 2
    assert value(s, "rocketmq_message_size_count", **normal) == NORMAL
    assert value(s, "rocketmq_message_size_bucket", **normal, le="1024.0") == 6  # ≤ 600 bytes
    # out: per topic and group, bytes as sent in the pull replies
    assert value(s, "rocketmq_messages_out_total", **lbl) == total
    assert value(s, "rocketmq_throughput_out_total", **lbl) == sum(m.store_size for m in pulled)
    # transactions: one commit, one rollback, none pending
    assert value(s, "rocketmq_commit_messages_total", topic=TX_TOPIC) == 1
    assert value(s, "rocketmq_rollback_messages_total", topic=TX_TOPIC) == 1
    assert value(s, "txmq_transaction_commits_total") == 1
    assert value(s, "rocketmq_half_messages", topic=TX_TOPIC) == 0
    assert value(s, "rocketmq_finish_message_latency_seconds_count") == 2
    # latency histograms: every send and pull request was timed
    sends = value(s, "rocketmq_rpc_latency_count", request_code="send_message_v2",
                  response_code="success", is_long_polling="false")
    assert sends >= NORMAL + DELAYED + 2
    assert value(s, "rocketmq_rpc_latency_bucket", request_code="send_message_v2",
                 response_code="success", is_long_polling="false", le="+Inf") == sends
    assert value(s, "rocketmq_rpc_latency_count", request_code="pull_message",
                 response_code="success", is_long_polling="false") >= 2
    assert value(s, "rocketmq_rpc_latency_count", request_code="end_transaction") == 0  # one-way
    # store
    assert value(s, "txmq_commit_log_max_offset_bytes") >= value(s, "txmq_storage_commit_log_bytes") > 0
    assert 0 < value(s, "txmq_storage_disk_ratio") <= 1
    assert value(s, "rocketmq_storage_size") > 0
    assert value(s, "rocketmq_storage_message_reserve_time") >= 0
    assert value(s, "rocketmq_topic_number") >= 2


def test_a_pending_half_message_shows_backlog_and_age(broker: Broker) -> None:
    class Unknown(_Decide):
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.UNKNOWN

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.UNKNOWN

    with TransactionProducer("metrics-unknown", broker.proc.endpoints, Unknown()) as tp:
        tp.send_message_in_transaction(Message(topic="metrics-pending", body=b"?"))
        wait_until(lambda: value(broker.scrape(), "txmq_half_messages_oldest_age_seconds",
                                 topic="metrics-pending") >= 0.2, timeout_s=10)
        assert value(broker.scrape(), "rocketmq_half_messages", topic="metrics-pending") == 1


# -- the Grafana dashboard ------------------------------------------------------------------------

_PROMQL_WORDS = {
    "sum", "avg", "max", "min", "count", "rate", "irate", "increase", "histogram_quantile", "by",
    "without", "topk", "bottomk", "clamp_min", "clamp_max", "time", "delta", "deriv", "abs",
    "label_replace", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "max_over_time", "min_over_time", "avg_over_time", "vector", "scalar", "sort_desc",
}


def _panels(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in node.get("panels", []):
        yield p
        yield from _panels(p)


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in _panels(board) for t in p.get("targets", []) if t.get("expr")]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: label matchers, ``by (…)`` lists, strings,
    ranges and Grafana variables removed, then every identifier that is not a PromQL word."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\$\w+|\$\{[^}]*\}", "", e)
    words = set(re.findall(r"(?<![\w.])[a-zA-Z_:][\w:]*", e))
    return words - _PROMQL_WORDS


def present(scrape: dict[str, Any], name: str) -> bool:
    """Whether a scrape has metric ``name``: as a sample name, or as the ``_total`` of a counter
    family or the ``_bucket``/``_sum``/``_count`` of a histogram family with no sample yet."""
    if any(n == name for n, _ in scrape["samples"]):
        return True
    fams = scrape["families"]
    for suffix, kind in (("_total", "counter"), ("_bucket", "histogram"), ("_sum", "histogram"),
                         ("_count", "histogram")):
        if name.endswith(suffix) and name[: -len(suffix)] in fams:
            return bool(fams[name[: -len(suffix)]].type == kind)
    return name in fams and fams[name].type in ("gauge", "counter", "unknown")


def test_metric_names_are_read_from_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, request_code) (rate(rocketmq_rpc_latency_bucket'
            '{request_code=~"send_message.*", instance=~"$instance"}[$__rate_interval]))) / '
            'clamp_min(sum(txmq_x), 1)')
    assert metric_names(expr) == {"rocketmq_rpc_latency_bucket", "txmq_x"}
    scrape = {"samples": {("a_total", frozenset()): 1.0},
              "families": {"h": _fam("h", "histogram"), "c": _fam("c", "counter")}}
    assert present(scrape, "a_total") and present(scrape, "h_bucket") and present(scrape, "c_total")
    assert not present(scrape, "h_total") and not present(scrape, "c_bucket")
    assert not present(scrape, "missing_total")


def _fam(name: str, kind: str) -> Metric:
    return Metric(name, "", kind)  # a family with no sample yet


def test_every_metric_the_dashboard_queries_exists(broker: Broker) -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 36
    assert any(v.get("type") == "datasource" and v.get("query") == "prometheus"
               for v in board["templating"]["list"])
    exprs = dashboard_exprs()
    assert len(exprs) >= 12
    scrape = broker.scrape()
    missing = {}
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert all(n.startswith(("rocketmq_", "txmq_")) for n in names), (expr, names)
        missing.update({n: expr for n in names if not present(scrape, n)})
    assert not missing, f"the dashboard queries metrics the broker does not export: {missing}"
