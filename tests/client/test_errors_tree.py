"""The error tree's remote branch, keyed by RocketMQ response code (#23 item 5)."""

from __future__ import annotations

import pytest

from txmq.client._core import check_response
from txmq.errors import (
    BrokerUnavailable,
    ConnectTimeout,
    GoAway,
    NoPermission,
    RemoteError,
    RequestTimeout,
    ResponseCode,
    ServiceNotAvailable,
    SystemBusy,
    TopicNotExist,
    TransactionNotFound,
    TransportError,
    TxmqError,
)
from txmq.protocol import FLAG_RESPONSE, Command


@pytest.mark.parametrize(("code", "cls"), [
    (ResponseCode.TOPIC_NOT_EXIST, TopicNotExist),
    (ResponseCode.NO_PERMISSION, NoPermission),
    (ResponseCode.SERVICE_NOT_AVAILABLE, ServiceNotAvailable),
    (ResponseCode.SYSTEM_BUSY, SystemBusy),
    (ResponseCode.GO_AWAY, GoAway),
    (ResponseCode.TRANSACTION_NOT_FOUND, TransactionNotFound),
])
def test_check_response_raises_the_subclass_of_the_code(code: ResponseCode,
                                                         cls: type[RemoteError]) -> None:
    assert RemoteError.for_code(code) is cls
    with pytest.raises(cls) as info:
        check_response(Command(code, 1, flag=FLAG_RESPONSE, remark="why"))
    e = info.value
    assert isinstance(e, RemoteError) and isinstance(e, TxmqError)
    assert e.response_code == code and e.remark == "why" and e.code == code.name


def test_an_unregistered_code_is_a_plain_remote_error() -> None:
    assert RemoteError.for_code(4242) is RemoteError
    e = RemoteError.of(4242, "odd")
    assert type(e) is RemoteError and e.code == "CODE_4242" and not e.retriable


def test_retriable_codes_and_every_subclass_is_registered_once() -> None:
    assert RemoteError.of(ResponseCode.SYSTEM_BUSY, "").retriable
    assert not RemoteError.of(ResponseCode.TOPIC_NOT_EXIST, "").retriable
    subs = RemoteError.__subclasses__()
    codes = [c.response_code_of_class for c in subs]
    assert len(subs) >= 10 and None not in codes and len(set(codes)) == len(codes)
    assert all(RemoteError.for_code(c) is s for c, s in zip(codes, subs, strict=True) if c)


def test_transport_branch() -> None:
    assert issubclass(ConnectTimeout, BrokerUnavailable)
    assert issubclass(BrokerUnavailable, TransportError)
    assert issubclass(RequestTimeout, TransportError)
    assert not issubclass(TransportError, RemoteError)
