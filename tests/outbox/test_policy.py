"""The sans-IO part of the outbox: the produce-side state machine, claimability, backoff, batching,
the give-up rule and the message envelope. No database, no broker."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import txmq.outbox as public
from txmq import limits
from txmq.client import ConsumeStatus, MessageExt
from txmq.errors import ConfigError
from txmq.outbox import EventStatus, RelayConfig, TxType
from txmq.outbox._envelope import OutboxRow, decode_event, to_message
from txmq.outbox._open import TxmqTransport, open_transport
from txmq.outbox._policy import (
    PRODUCE_TRANSITIONS,
    ConsumeVerdict,
    ProduceInput,
    after_handler_failure,
    backoff_ms,
    before_handler,
    claimable,
    idle_wait_ms,
    next_status,
    plan_batches,
)
from txmq.outbox._transport import (
    NotAnEnvelope,
    Verdict,
    from_headers,
    parse_transport_url,
    to_headers,
    txmq_addresses,
    verdict,
)
from txmq.protocol import Message

PRODUCE = [EventStatus.PRODUCE_INIT, EventStatus.PRODUCE_PROCESSING, EventStatus.PRODUCE_PROCESSED]


@given(status=st.sampled_from(PRODUCE), event=st.sampled_from(list(ProduceInput)))
def test_every_state_and_input_pair_is_decided_by_the_table(status: EventStatus, event: ProduceInput) -> None:
    allowed = PRODUCE_TRANSITIONS[status]
    if event in allowed:
        assert next_status(status, event) is allowed[event]
    else:
        with pytest.raises(ValueError, match="no transition"):
            next_status(status, event)


def test_processed_is_reached_only_by_an_acknowledgement() -> None:
    into = [(s, e) for s, row in PRODUCE_TRANSITIONS.items() for e, t in row.items()
            if t is EventStatus.PRODUCE_PROCESSED]
    assert into == [(EventStatus.PRODUCE_PROCESSING, ProduceInput.ACK)]
    assert PRODUCE_TRANSITIONS[EventStatus.PRODUCE_PROCESSED] == {}


@given(status=st.sampled_from([*PRODUCE, EventStatus.CONSUME_PROCESSED]), due=st.integers(-5, 5),
       lease=st.one_of(st.none(), st.integers(-5, 5)))
def test_claimable(status: EventStatus, due: int, lease: int | None) -> None:
    now = 100
    got = claimable(status, now + due, None if lease is None else now + lease, now)
    if status is EventStatus.PRODUCE_INIT:
        assert got == (due <= 0)
    elif status is EventStatus.PRODUCE_PROCESSING:
        assert got == (lease is not None and lease <= 0)
    else:
        assert not got


@given(attempts=st.integers(1, 200), seed=st.integers(0, 2**32))
def test_backoff_doubles_is_capped_and_jittered_down_only(attempts: int, seed: int) -> None:
    cfg = RelayConfig(backoff_base_ms=100, backoff_max_ms=10_000)
    d = backoff_ms(attempts, cfg, random.Random(seed))
    full = min(10_000, 100 * 2 ** (attempts - 1))
    assert full // 2 <= d <= full


def row(i: int, topic: str, size: int) -> OutboxRow:
    return OutboxRow(id=i, event_id=f"e{i}", fencing_token=1, attempts=1, app_id="a", biz_key=f"k{i}",
                     event_type="E", tx_type="COMMIT", topic=topic, tags="", keys="", properties={},
                     payload=b"x" * size, origin_event_id=None, created_at_ms=0)


@given(specs=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 300)), max_size=60),
       count_max=st.integers(1, 8), bytes_max=st.integers(1, 1000))
def test_batches_keep_every_row_once_in_order_and_within_limits(
        specs: list[tuple[str, int]], count_max: int, bytes_max: int) -> None:
    rows = [row(i, t, n) for i, (t, n) in enumerate(specs)]
    batches = plan_batches(rows, count_max, bytes_max)
    assert sorted(r.id for b in batches for r in b) == [r.id for r in rows]
    for b in batches:
        assert len({r.topic for r in b}) == 1 and 1 <= len(b) <= count_max
        assert len(b) == 1 or sum(len(r.payload) for r in b) <= bytes_max
        assert [r.id for r in b] == sorted(r.id for r in b)


def test_idle_wait() -> None:
    cfg = RelayConfig(batch_size=10, period_ms=700)
    assert (idle_wait_ms(10, cfg), idle_wait_ms(9, cfg), idle_wait_ms(0, cfg)) == (0, 700, 700)


@given(reconsume=st.integers(0, 30), maximum=st.one_of(st.none(), st.integers(1, 20)))
def test_the_handler_runs_at_most_max_times(reconsume: int, maximum: int | None) -> None:
    before = before_handler(reconsume, maximum)
    after = after_handler_failure(reconsume, maximum)
    if maximum is None:
        assert (before, after) == (ConsumeVerdict.RUN_HANDLER, ConsumeVerdict.RECONSUME_LATER)
    else:
        assert (before is ConsumeVerdict.EMIT_ROLLBACK) == (reconsume >= maximum)
        assert (after is ConsumeVerdict.EMIT_ROLLBACK) == (reconsume + 1 >= maximum)


@pytest.mark.parametrize("kw", [{"batch_size": 0}, {"batch_size": limits.OUTBOX_RELAY_BATCH_SIZE_MAX + 1},
                                {"pool_size": 0}, {"period_ms": 0}, {"lease_ms": -1},
                                {"initial_delay_ms": -1}, {"backoff_base_ms": 10, "backoff_max_ms": 5},
                                {"retention_ms": 0}])
def test_relay_config_refuses_nonsense(kw: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        RelayConfig(**kw)


def test_defaults_follow_the_seed() -> None:
    cfg = RelayConfig()
    assert (cfg.batch_size, cfg.pool_size, cfg.initial_delay_ms) == (50, 1, 0)
    assert limits.OUTBOX_MAX_COMMIT_RECONSUME_TIMES == 10 < limits.MAX_RECONSUME_TIMES == 16


def test_the_envelope_round_trips() -> None:
    r = dataclasses.replace(row(1, "orders", 3), properties={"trace": "t1", "UNIQ_KEY": "x"},
                            tx_type="ROLLBACK", origin_event_id="e0")
    m = to_message(r)
    assert (m.msg_id, m.tags, m.keys, m.properties["trace"]) == ("e1", "E", "k1", "t1")
    ev = decode_event(MessageExt(topic=m.topic, body=m.body, tags=m.tags, keys=m.keys,
                                 properties=m.properties, reconsume_times=2))
    assert (ev.event_id, ev.app_id, ev.biz_key, ev.event_type, ev.tx_type, ev.origin_event_id,
            ev.reconsume_times) == ("e1", "a", "k1", "E", TxType.ROLLBACK, "e0", 2)


def test_public_names() -> None:
    assert sorted(public.__all__) == sorted(n for n in dir(public) if not n.startswith("_")
                                            and n not in {"annotations"} and not _is_module(n))
    for name in ("put_message", "Relay", "RelayConfig", "CommitListener", "RollbackListener", "init_db",
                 "outbox_status", "purge", "OutboxMetrics", "TxType", "EventStatus"):
        assert name in public.__all__
        assert getattr(public, name).__doc__


def _is_module(name: str) -> bool:
    import types

    return isinstance(getattr(public, name), types.ModuleType)


# -- transports: the sans-IO parts ------------------------------------------------------------------
def test_transport_urls_map_to_kinds() -> None:
    assert parse_transport_url("txmq://127.0.0.1:10911") == ("txmq", "127.0.0.1:10911")
    assert parse_transport_url("txmq://a:1;b:2") == ("txmq", "a:1;b:2")
    url = "amqp://guest:guest@127.0.0.1:5672/"
    assert parse_transport_url(url) == ("rabbitmq", url)
    assert parse_transport_url("nats://127.0.0.1:4222") == ("nats", "nats://127.0.0.1:4222")
    with pytest.raises(ConfigError, match="unknown scheme 'http'"):
        parse_transport_url("http://x:1")


def test_txmq_urls_name_a_broker_or_name_servers() -> None:
    assert txmq_addresses("txmq://127.0.0.1:10911") == ("127.0.0.1:10911", "")
    assert txmq_addresses("txmq://ns:9876?namesrv=1") == ("", "ns:9876")
    assert txmq_addresses("txmq://a:1;b:2?namesrv=true") == ("", "a:1;b:2")
    assert txmq_addresses("txmq://a:1;b:2") == ("", "a:1;b:2")  # a broker is one address
    assert txmq_addresses("txmq://b:1?namesrv=0") == ("b:1", "")
    for bad, why in (("txmq://a:1?namesrv=maybe", "use 1 or 0"), ("txmq://a:1;b:2?namesrv=no", "one"),
                     ("nats://a:1", "not a txmq")):
        with pytest.raises(ConfigError, match=why):
            txmq_addresses(bad)
    t = open_transport("txmq://ns1:9876;ns2:9876?namesrv=1")
    assert isinstance(t, TxmqTransport) and (t.endpoints, t.namesrv_addr) == ("", "ns1:9876;ns2:9876")


def test_headers_round_trip_and_non_envelopes_are_named() -> None:
    msg = Message(topic="t", body=b"b", tags="T", keys="k1 k2", properties={
        "UNIQ_KEY": "E1", "TXMQ_OUTBOX_EVENT_ID": "E1", "TXMQ_OUTBOX_TX_TYPE": "ROLLBACK", "user": "u"})
    got = from_headers("t", b"b", {**to_headers(msg), "x-delivery-count": 3}, 3)
    assert (got.tags, got.keys, got.properties, got.reconsume_times) == ("T", "k1 k2", msg.properties, 3)
    for headers, reason in (({}, "no TXMQ_OUTBOX_EVENT_ID"),
                            ({"TXMQ_OUTBOX_EVENT_ID": "E", "TXMQ_OUTBOX_TX_TYPE": "X"}, "'X' is not COMMIT"),
                            ({"TXMQ_OUTBOX_EVENT_ID": "E", "n": 5}, "'n' is a int"),
                            ({"TXMQ_OUTBOX_EVENT_ID": b"\xff"}, "not UTF-8")):
        with pytest.raises(NotAnEnvelope, match=reason):
            from_headers("t", b"", headers, 0)


def test_consume_verdicts() -> None:
    ok, later = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER
    assert verdict(ok, 5, 2, broker_limits=False) is Verdict.ACK
    assert [verdict(later, n, 2, broker_limits=False) for n in (1, 2, 3)] == [
        Verdict.RETRY, Verdict.RETRY, Verdict.DEAD_LETTER]  # 1 delivery + 2 reconsumes, then the DLQ
    assert verdict(later, 3, 2, broker_limits=True) is Verdict.RETRY  # RabbitMQ's delivery limit decides
