"""Validation at the door: names, properties and numbers (RocketMQ TopicValidator rules)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq import limits
from txmq.errors import InvalidRequest, ResponseCode
from txmq.protocol import (
    BROKER_ONLY_PROPERTIES,
    BROKER_TOPICS,
    check_group,
    check_offset,
    check_properties,
    check_queue_id,
    check_send_properties,
    check_send_topic,
    check_timestamp,
    check_topic,
    delay_level,
    is_valid_topic,
    parse_int,
)

NAME_CHARS = string.ascii_letters + string.digits + "%|_-"
names = st.text(NAME_CHARS, min_size=1, max_size=limits.GROUP_NAME_MAX_CHARS)


def _code(fn: object, *args: object) -> ResponseCode:
    with pytest.raises(InvalidRequest) as exc:
        fn(*args)  # type: ignore[operator]
    return exc.value.response_code


@given(names)
def test_valid_names_are_always_accepted_and_their_retry_and_dlq_topics_too(name: str) -> None:
    assert check_topic(name) == name and check_group(name) == name
    assert is_valid_topic(f"%RETRY%{name}") and is_valid_topic(f"%DLQ%{name}")


@given(st.text(min_size=1, max_size=40).filter(lambda s: any(c not in NAME_CHARS for c in s)))
def test_anything_outside_the_charset_is_refused(name: str) -> None:
    assert not is_valid_topic(name)
    assert _code(check_topic, name) == ResponseCode.MESSAGE_ILLEGAL
    assert _code(check_group, name) == ResponseCode.MESSAGE_ILLEGAL


@pytest.mark.parametrize("name", ["", ".", "..", "../../../x", "a/b", "a b", "a@b", "a.b", "€" * 100,
                                  "a\0b", "x" * (limits.TOPIC_NAME_MAX_CHARS + 1)])
def test_names_that_are_not_topics(name: str) -> None:
    assert _code(check_topic, name) == ResponseCode.MESSAGE_ILLEGAL


def test_length_limits_of_topics_and_groups() -> None:
    check_topic("t" * limits.TOPIC_NAME_MAX_CHARS)
    check_group("g" * limits.GROUP_NAME_MAX_CHARS)
    assert _code(check_group, "g" * (limits.GROUP_NAME_MAX_CHARS + 1)) == ResponseCode.MESSAGE_ILLEGAL


@pytest.mark.parametrize("topic", [*sorted(BROKER_TOPICS), "rmq_sys_x", "TXMQ_SYS_PARKED"])
def test_broker_topics_are_legal_names_but_not_for_clients_to_write(topic: str) -> None:
    assert check_topic(topic) == topic
    assert _code(check_send_topic, topic) == ResponseCode.NO_PERMISSION


def test_queue_ids_offsets_and_timestamps() -> None:
    assert check_queue_id(3, 4, "t") == 3
    for bad in (-1, 4, 2**40):
        assert _code(check_queue_id, bad, 4, "t") == ResponseCode.MESSAGE_ILLEGAL
    assert check_offset(0) == 0 and check_offset(-1, none_ok=True) == -1
    assert _code(check_offset, -1) == ResponseCode.MESSAGE_ILLEGAL
    assert _code(check_offset, -2, "offset") == ResponseCode.MESSAGE_ILLEGAL
    assert check_timestamp(limits.TIMESTAMP_MAX_MS) == limits.TIMESTAMP_MAX_MS
    assert _code(check_timestamp, -1) == ResponseCode.MESSAGE_ILLEGAL
    assert _code(check_timestamp, 2**63) == ResponseCode.MESSAGE_ILLEGAL


@pytest.mark.parametrize(("value", "code"), [
    ("abc", ResponseCode.INVALID_PARAMETER), ("1.5", ResponseCode.INVALID_PARAMETER),
    ("", ResponseCode.INVALID_PARAMETER), ("9" * 40, ResponseCode.INVALID_PARAMETER),
    (True, ResponseCode.INVALID_PARAMETER), (None, ResponseCode.INVALID_PARAMETER),
    ("11", ResponseCode.MESSAGE_ILLEGAL), ("-1", ResponseCode.MESSAGE_ILLEGAL),
])
def test_parse_int_tells_unparsable_from_out_of_range(value: object, code: ResponseCode) -> None:
    assert _code(parse_int, value, "n", 0, 10) == code


def test_parse_int_accepts_digits_and_ints() -> None:
    assert parse_int("7", "n", 0, 10) == parse_int(7, "n", 0, 10) == 7


@pytest.mark.parametrize("props", [
    {"": "v"}, {"a\u0001b": "v"}, {"a\u0002b": "v"}, {"a\0": "v"}, {"a\nb": "v"},
    {"k": "a\u0001b"}, {"k": "a\u0002b"},
    {"k" * (limits.PROPERTY_KEY_MAX_CHARS + 1): "v"},
    {"k": "v" * (limits.PROPERTY_VALUE_MAX_CHARS + 1)},
    {f"k{i}": "v" * 4000 for i in range(9)},  # 36 kB in all
])
def test_properties_with_separators_or_too_large_are_refused(props: dict[str, str]) -> None:
    assert _code(check_properties, props) == ResponseCode.MESSAGE_ILLEGAL


@given(st.dictionaries(st.text(string.ascii_letters + "_", min_size=1, max_size=30),
                       st.text(max_size=50).filter(lambda v: "\u0001" not in v and "\u0002" not in v),
                       max_size=10))
def test_ordinary_properties_pass(props: dict[str, str]) -> None:
    assert check_properties(props) >= 0


@pytest.mark.parametrize("name", sorted(BROKER_ONLY_PROPERTIES))
def test_broker_only_properties_are_refused_from_clients(name: str) -> None:
    assert _code(check_send_properties, {name: "0"}) == ResponseCode.NO_PERMISSION


@pytest.mark.parametrize(("props", "code"), [
    ({"DELAY": "abc"}, ResponseCode.INVALID_PARAMETER),
    ({"DELAY": "-1"}, ResponseCode.MESSAGE_ILLEGAL),
    ({"TRAN_MSG": "yes"}, ResponseCode.INVALID_PARAMETER),
    ({"CHECK_IMMUNITY_TIME_IN_SECONDS": "x"}, ResponseCode.INVALID_PARAMETER),
    ({"CHECK_IMMUNITY_TIME_IN_SECONDS": str(limits.CHECK_IMMUNITY_TIME_MAX_S + 1)},
     ResponseCode.MESSAGE_ILLEGAL),
    ({"PGROUP": "a/b"}, ResponseCode.MESSAGE_ILLEGAL),
    ({"RETRY_TOPIC": ".."}, ResponseCode.MESSAGE_ILLEGAL),
    ({"TXMQ_SINK_BATCH": "s/1"}, ResponseCode.MESSAGE_ILLEGAL),  # only on half messages
])
def test_client_settable_properties_are_checked(props: dict[str, str], code: ResponseCode) -> None:
    assert _code(check_send_properties, props) == code


def test_what_todays_clients_send_passes() -> None:
    """The SDK's half messages, delay messages, Spark sink halves and outbox events."""
    assert check_send_properties({"TRAN_MSG": "true", "PGROUP": "pg", "UNIQ_KEY": "AB01"})
    assert check_send_properties({"TRAN_MSG": "true", "TXMQ_SINK_BATCH": "sink/3",
                                  "TXMQ_SINK_TASK": "0.1", "CHECK_IMMUNITY_TIME_IN_SECONDS": "60"})
    assert not check_send_properties({"DELAY": "3", "UNIQ_KEY": "x", "TXMQ_OUTBOX_EVENT_ID": "e1",
                                      "RETRY_TOPIC": "t", "ORIGIN_MESSAGE_ID": "m",
                                      "RECONSUME_TIME": "2", "MAX_RECONSUME_TIMES": "16"})
    assert delay_level({"DELAY": "99"}) == 99  # above the highest level: clamped when scheduled
    assert delay_level({}) == delay_level({"DELAY": ""}) == 0
