"""Request signatures (``txmq.protocol`` ACL signing), against vectors computed outside Python from the
documented algorithm (``openssl dgst -sha1 -hmac``) and a request signed by the real C++ client core."""

from __future__ import annotations

import pytest

from txmq.protocol import (
    ACCESS_KEY,
    SIGNATURE,
    grpc_authorization,
    grpc_date_time,
    parse_grpc_authorization,
    parse_grpc_date_time,
    remoting_content,
    remoting_signature,
    sign_remoting,
)

# printf 'aliceALIYUN12orders''hello' | openssl dgst -sha1 -hmac alice-sk -binary | base64
REMOTING_EXT = {"topic": "orders", "queueId": "12", "OnsChannel": "ALIYUN", "AccessKey": "alice"}
REMOTING_VECTOR = "wk581aMo0fqyIpx2W2yiY0QOdvI="
# printf 20261123T081500Z | openssl dgst -sha1 -hmac alice-sk -hex
GRPC_DATE = "20261123T081500Z"
GRPC_VECTOR = "2460fcb92421e6c23698825960a6cbe17102ec92"

# SEND_MESSAGE_V2 as the RocketMQ C++ core 2.1.0 signed it (secret key "bad"), seen on the wire
CPP_EXT = {"AccessKey": "alice", "OnsChannel": "ALIYUN", "Signature": "BLt1zrItqg8zQkP/C1SKj3CMjLM=",
           "a": "pg", "b": "orders", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1795422203512",
           "h": "0", "i": "KEYS\x01acl-0\x02UNIQ_KEY\x017F0000015DAA1CD65AAE7318C6780000\x02WAIT\x01true\x02",
           "j": "0", "k": "0", "l": "16", "m": "0"}


def test_remoting_content_sorts_fields_and_appends_the_body() -> None:
    assert remoting_content(REMOTING_EXT, b"hello") == b"aliceALIYUN12ordershello"
    assert remoting_content({**REMOTING_EXT, SIGNATURE: "x"}, b"hello") == b"aliceALIYUN12ordershello"


def test_remoting_signature_matches_openssl() -> None:
    assert remoting_signature(remoting_content(REMOTING_EXT, b"hello"), "alice-sk") == REMOTING_VECTOR


def test_sign_remoting_adds_access_key_and_signature() -> None:
    ext = {"topic": "orders", "queueId": "12", "OnsChannel": "ALIYUN"}
    signed = sign_remoting(ext, b"hello", "alice", "alice-sk")
    assert signed[ACCESS_KEY] == "alice"
    assert signed[SIGNATURE] == REMOTING_VECTOR
    assert SIGNATURE not in ext  # the caller's dict is not changed
    token = sign_remoting(ext, b"hello", "alice", "alice-sk", security_token="tok")
    assert token["SecurityToken"] == "tok" and token[SIGNATURE] != REMOTING_VECTOR


def test_the_cpp_clients_signature_verifies() -> None:
    content = remoting_content(CPP_EXT, b"acl:0", version=333)
    assert remoting_signature(content, "bad") == CPP_EXT[SIGNATURE]
    assert remoting_signature(content, "alice-sk") != CPP_EXT[SIGNATURE]


def test_old_clients_do_not_sign_the_unique_key_query_flag() -> None:
    ext = {"topic": "t", "_UNIQUE_KEY_QUERY": "true"}
    assert remoting_content(ext, b"", version=399) == b"t"  # V4_9_3 and older
    assert remoting_content(ext, b"", version=400) == b"truet"


def test_grpc_authorization_matches_openssl_and_parses_back() -> None:
    header = grpc_authorization("alice", "alice-sk", GRPC_DATE)
    assert header == ("MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, "
                      f"Signature={GRPC_VECTOR}")
    assert parse_grpc_authorization(header) == ("alice", bytes.fromhex(GRPC_VECTOR))
    assert parse_grpc_authorization("MQv2-HMAC-SHA1 Credential=ak/x, Signature=00")[0] == "ak"


@pytest.mark.parametrize("bad", ["MQv2-HMAC-SHA1", "MQv2-HMAC-SHA1 Credential", "X Signature=zz"])
def test_malformed_authorization_is_a_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_grpc_authorization(bad)


def test_grpc_date_time_round_trips() -> None:
    assert grpc_date_time(parse_grpc_date_time(GRPC_DATE)) == GRPC_DATE
    assert parse_grpc_date_time("19700101T000001Z") == 1000
