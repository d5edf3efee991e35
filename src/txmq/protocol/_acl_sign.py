"""Request signatures of RocketMQ's ACL, sans-IO: what a client adds and what a broker checks.

Remoting (ACL 1.0, kept by ACL 2.0): the client adds ext fields ``AccessKey``, optionally
``SecurityToken``, and ``Signature`` = base64(HmacSHA1(secret key, content)), where content is the
values of every other ext field sorted by key (``Signature`` itself left out), concatenated as UTF-8,
followed by the body (apache/rocketmq ``AclClientRPCHook#doBeforeRequest`` and
``AclUtils.combineRequestContent`` sign it; ``DefaultAuthenticationContextBuilder#build(…,
RemotingCommand)`` and ``PlainAccessValidator#parse`` rebuild it on the broker, leaving out
``_UNIQUE_KEY_QUERY`` for clients of version V4_9_3 and older; ``AclSigner.calSignature`` is the
HMAC).

gRPC (RocketMQ 5): metadata ``x-mq-date-time`` (``yyyyMMdd'T'HHmmss'Z'``, UTC) and
``authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex
HmacSHA1(secret key, date time)>`` (rocketmq-clients python ``rocketmq/v5/util/signature.py``;
the proxy parses it in ``DefaultAuthenticationContextBuilder#build(Metadata, …)``).
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hashlib
import hmac
import time

__all__ = [
    "ACCESS_KEY",
    "AUTHORIZATION",
    "DATE_TIME",
    "GRPC_SIGN_ALGORITHM",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "grpc_authorization",
    "grpc_date_time",
    "parse_grpc_authorization",
    "parse_grpc_date_time",
    "remoting_content",
    "remoting_signature",
    "sign_remoting",
]

ACCESS_KEY = "AccessKey"
"""Ext field naming the user (RocketMQ ``SessionCredentials.ACCESS_KEY``)."""
SIGNATURE = "Signature"
"""Ext field carrying the signature (``SessionCredentials.SIGNATURE``)."""
SECURITY_TOKEN = "SecurityToken"
"""Optional ext field (``SessionCredentials.SECURITY_TOKEN``); signed like any other field."""
AUTHORIZATION = "authorization"
"""gRPC metadata key of the credentials (``GrpcConstants.AUTHORIZATION``)."""
DATE_TIME = "x-mq-date-time"
"""gRPC metadata key of the signed date time (``GrpcConstants.DATE_TIME``)."""
GRPC_SIGN_ALGORITHM = "MQv2-HMAC-SHA1"
_UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG
_V4_9_3 = 399  # MQVersion.Version.V4_9_3.ordinal()
_DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


def remoting_content(ext: dict[str, str], body: bytes, version: int | None = None) -> bytes:
    """The bytes a remoting request's signature covers: ext values but ``Signature``'s, sorted by
    key, then the body. ``version`` is the request's (``_UNIQUE_KEY_QUERY`` is not signed by
    clients of V4_9_3 and older); None signs every field, as a client does."""
    skip_unique = version is not None and version <= _V4_9_3
    parts = [v for k, v in sorted(ext.items())
             if k != SIGNATURE and not (skip_unique and k == _UNIQUE_KEY_QUERY)]
    return "".join(parts).encode() + body


def remoting_signature(content: bytes, secret_key: str) -> str:
    """base64(HmacSHA1(``secret_key``, ``content``)) (RocketMQ ``AclSigner.calSignature``)."""
    mac = hmac.new(secret_key.encode(), content, hashlib.sha1).digest()
    return base64.b64encode(mac).decode()


def sign_remoting(ext: dict[str, str], body: bytes, access_key: str, secret_key: str,
                  security_token: str = "") -> dict[str, str]:
    """``ext`` with ``AccessKey``, ``SecurityToken`` (if given) and ``Signature`` added, as
    RocketMQ's ``AclClientRPCHook`` signs a request (a new dict; ``ext`` is not changed)."""
    out = {k: v for k, v in ext.items() if k != SIGNATURE}
    out[ACCESS_KEY] = access_key
    if security_token:
        out[SECURITY_TOKEN] = security_token
    out[SIGNATURE] = remoting_signature(remoting_content(out, body), secret_key)
    return out


def grpc_date_time(now_ms: int) -> str:
    """The ``x-mq-date-time`` value for a time (ms since the epoch): ``20261123T081500Z``."""
    return time.strftime(_DATE_TIME_FORMAT, time.gmtime(now_ms / 1000))


def parse_grpc_date_time(value: str) -> int:
    """ms since the epoch of an ``x-mq-date-time`` value (UTC). Raises ValueError."""
    return calendar.timegm(time.strptime(value, _DATE_TIME_FORMAT)) * 1000


def grpc_authorization(access_key: str, secret_key: str, date_time: str) -> str:
    """The ``authorization`` metadata value signing ``date_time`` (hex HMAC-SHA1)."""
    sig = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    return (f"{GRPC_SIGN_ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, "
            f"Signature={sig}")


def parse_grpc_authorization(value: str) -> tuple[str, bytes]:
    """``(access key, signature bytes)`` of an ``authorization`` value, parsed as the proxy does
    (algorithm, then ``key=value`` items split on commas; the credential is the part before
    ``/``; the signature is hex); "" for an absent credential. Raises ValueError naming what is
    wrong."""
    parts = value.split(" ", 1)
    if len(parts) != 2:
        raise ValueError("authentication header is incorrect")
    access_key, signature = "", b""
    for item in parts[1].split(","):
        kv = item.strip().split("=", 1)
        if len(kv) != 2:
            raise ValueError("authentication key=value item is incorrect")
        if kv[0] == "Credential":
            access_key = kv[1].split("/")[0]
        elif kv[0] == "Signature":
            try:
                signature = binascii.unhexlify(kv[1])
            except (binascii.Error, ValueError) as exc:
                raise ValueError("signature is not hex") from exc
    return access_key, signature
