"""The transport interface of the relay and the inbox side, and the sans-IO parts every transport
shares: URL parsing, the envelope as broker headers, and the consume verdict.

A transport does three things, whatever the broker:

* **send with a durable acknowledgement**: :meth:`Transport.send_batch` returns only once the
  broker stored every message (RocketMQ send result, RabbitMQ publisher confirm, JetStream publish
  ack) and raises otherwise, so the relay marks nothing sent that the broker does not hold;
* **consume with ack / nack and a redelivery count**: :meth:`Transport.subscribe` runs a listener
  (:class:`~txmq.outbox.CommitListener`, :class:`~txmq.outbox.RollbackListener`, or any
  ``listener(list[MessageExt]) -> ConsumeStatus``) on each delivery, with
  ``MessageExt.reconsume_times`` = earlier deliveries; ``CONSUME_SUCCESS`` acknowledges,
  ``RECONSUME_LATER`` asks for a redelivery;
* **a dead-letter destination** per consumer group: a message that failed
  ``max_reconsume_times + 1`` deliveries, or that is not an outbox envelope, goes there;
  :meth:`Transport.dead_letters` reads it back. The reason is in property ``TXMQ_DLQ_REASON`` when
  the consumer moved the message (RabbitMQ's own delivery-limit dead-lettering records it in
  ``x-death`` instead).

The name mapping (topic, retry, DLQ, rollback topic) per broker is in docs/outbox.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from txmq import limits
from txmq.client import ConsumeStatus
from txmq.errors import ConfigError
from txmq.outbox._envelope import PROPERTY_OUTBOX_EVENT_ID, PROPERTY_OUTBOX_TX_TYPE
from txmq.outbox._schema import TxType
from txmq.protocol import PROPERTY_UNIQ_KEY, Message, MessageExt

__all__ = [
    "HEADER_KEYS",
    "HEADER_TAGS",
    "PROPERTY_DLQ_REASON",
    "SCHEMES",
    "Listener",
    "NotAnEnvelope",
    "Subscription",
    "Transport",
    "Verdict",
    "check_name",
    "from_headers",
    "parse_transport_url",
    "to_headers",
    "txmq_addresses",
    "verdict",
]

PROPERTY_DLQ_REASON = "TXMQ_DLQ_REASON"
"""Why the consumer moved a message to the dead-letter destination (free text)."""
HEADER_TAGS = "TXMQ_TAGS"
"""RocketMQ ``TAGS`` as a RabbitMQ / NATS header."""
HEADER_KEYS = "TXMQ_KEYS"
"""RocketMQ ``KEYS`` as a RabbitMQ / NATS header."""

SCHEMES = {"txmq": "txmq", "amqp": "rabbitmq", "amqps": "rabbitmq", "nats": "nats", "tls": "nats"}
"""URL scheme → transport kind."""

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")

Listener = Callable[[list[MessageExt]], ConsumeStatus]
"""What a subscription runs per delivery (one message per call)."""


class Subscription(Protocol):
    """A consumer of one topic for one group; created stopped."""

    def start(self) -> None:
        """Begin consuming (declares the broker objects it needs). Raises BrokerUnavailable."""

    def shutdown(self) -> None:
        """Stop consuming; deliveries in flight are finished or left unacknowledged. Idempotent."""


class Transport(Protocol):
    """A broker the relay sends with and inbox listeners consume from (txmq, RabbitMQ, NATS).

    Attributes:
        url: the URL it was opened with (credentials included; do not log it).
        kind: ``"txmq"``, ``"rabbitmq"`` or ``"nats"``.
    """

    url: str
    kind: str

    def connect(self) -> None:
        """Connect now (otherwise the first use connects). Raises BrokerUnavailable."""

    def send_batch(self, msgs: list[Message]) -> object:
        """Send messages of ONE topic; return once the broker durably holds all of them.

        Raises:
            Exception: anything (BrokerUnavailable, a broker refusal, a timeout): the relay keeps
                the rows and retries after a backoff. Some messages may have been stored; their
                resend is absorbed by the inbox (and by JetStream's ``Nats-Msg-Id`` dedup).
        """

    def ensure_topic(self, topic: str) -> None:
        """Create ``topic``'s broker objects if they do not exist (txmq topic, RabbitMQ exchange,
        JetStream stream). Raises ConfigError for a name the broker cannot carry."""

    def subscribe(self, group: str, topic: str, listener: Listener, *,
                  max_reconsume_times: int) -> Subscription:
        """A (not started) consumer of ``topic`` for ``group``: at most ``max_reconsume_times + 1``
        deliveries of a message, then its dead-letter destination."""

    def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        """The dead letters of ``group`` for ``topic`` (at most ``OUTBOX_TRANSPORT_DLQ_READ_MAX``),
        without removing them. For operators and tests."""

    def close(self) -> None:
        """Close connections. Idempotent."""


def parse_transport_url(url: str) -> tuple[str, str]:
    """``(kind, address)`` of a transport URL.

    ``txmq://host:port[;host:port][?namesrv=1]`` → ``("txmq", "host:port[;host:port]")`` (a broker,
    or name servers: see :func:`txmq_addresses`); ``amqp[s]://user:pass@host:port/vhost`` →
    ``("rabbitmq", url)``;
    ``nats://host:port`` or ``tls://…`` → ``("nats", url)``.

    Raises:
        ConfigError: an unknown scheme, no host, or a port that is not a number.
    """
    parts = urlsplit(url)
    kind = SCHEMES.get(parts.scheme.lower())
    if kind is None:
        raise ConfigError(f"transport URL {_redact(url)!r}: unknown scheme {parts.scheme!r}; use one of "
                          + ", ".join(f"{s}://" for s in SCHEMES))
    try:
        hosts = [h for h in parts.netloc.rsplit("@", 1)[-1].split(";") if h]
        for h in hosts:
            int(h.rsplit(":", 1)[1]) if ":" in h else None
    except ValueError:
        raise ConfigError(f"transport URL {_redact(url)!r}: the port is not a number") from None
    if not hosts or any(not h.rsplit(":", 1)[0] for h in hosts):
        raise ConfigError(f"transport URL {_redact(url)!r} names no host")
    return kind, (";".join(hosts) if kind == "txmq" else url)


_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def txmq_addresses(url: str) -> tuple[str, str]:
    """``(endpoints, namesrv_addr)`` of a ``txmq://`` URL, as the clients take them.

    ``txmq://host:port`` is one broker (``endpoints``); ``txmq://host:port[;host:port]?namesrv=1``
    is name servers (RocketMQ ``namesrvAddr``, tried in turn), through which the relay and the inbox
    use every broker group of a cluster. Several hosts are name servers without the flag too (a
    broker is one address).

    Raises:
        ConfigError: as :func:`parse_transport_url`; not a ``txmq://`` URL; ``namesrv`` neither
            1/true/yes nor 0/false/no; several hosts with ``namesrv=0``.
    """
    kind, address = parse_transport_url(url)
    if kind != "txmq":
        raise ConfigError(f"transport URL {_redact(url)!r} is not a txmq:// URL")
    flag = parse_qs(urlsplit(url).query).get("namesrv", [""])[-1].strip().lower()
    if flag and flag not in _TRUE + _FALSE:
        raise ConfigError(f"transport URL {url!r}: namesrv={flag!r}; use 1 or 0")
    several = ";" in address
    if flag in _FALSE and flag and several:
        raise ConfigError(f"transport URL {url!r}: a broker is one host:port (namesrv=0)")
    if flag in _TRUE or several:
        return "", address
    return address, ""


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return url.replace(parts.netloc, "***@" + parts.netloc.rsplit("@", 1)[1], 1)


def check_name(name: str, what: str) -> str:
    """``name`` if a broker name can carry it (letters, digits, ``_``, ``-``; at most 127), else
    raises ConfigError. (RocketMQ also allows ``%`` and ``|``, which NATS durable names refuse.)"""
    if not _NAME.match(name) or len(name) > limits.OUTBOX_TRANSPORT_NAME_MAX_CHARS:
        raise ConfigError(f"{what} {name!r}: use 1..{limits.OUTBOX_TRANSPORT_NAME_MAX_CHARS} letters, "
                          "digits, '_' or '-'")
    return name


def to_headers(msg: Message) -> dict[str, str]:
    """The message's properties plus its tags and keys, as string headers."""
    h = dict(msg.properties)
    if msg.tags:
        h[HEADER_TAGS] = msg.tags
    if msg.keys:
        h[HEADER_KEYS] = msg.keys
    return h


class NotAnEnvelope(Exception):
    """A delivered message that is not an outbox envelope; ``str(exc)`` is the reason."""


def from_headers(topic: str, body: bytes, headers: dict[str, object], reconsume_times: int) -> MessageExt:
    """The :class:`MessageExt` a listener sees for a RabbitMQ / NATS delivery.

    Raises:
        NotAnEnvelope: a header value that is not text, no ``TXMQ_OUTBOX_EVENT_ID``, or an unknown
            ``TXMQ_OUTBOX_TX_TYPE`` (such a message goes to the DLQ with this reason).
    """
    props: dict[str, str] = {}
    for k, v in headers.items():
        if isinstance(v, bytes):
            try:
                v = v.decode()
            except UnicodeDecodeError:
                raise NotAnEnvelope(f"header {k!r} is not UTF-8 text") from None
        if not isinstance(v, str):
            if k.startswith("x-"):  # the broker's own headers (x-death, x-delivery-count)
                continue
            raise NotAnEnvelope(f"header {k!r} is a {type(v).__name__}, not text")
        props[k] = v
    event_id = props.get(PROPERTY_OUTBOX_EVENT_ID)
    if not event_id:
        raise NotAnEnvelope(f"not an outbox envelope: no {PROPERTY_OUTBOX_EVENT_ID} header")
    if props.get(PROPERTY_OUTBOX_TX_TYPE, TxType.COMMIT) not in TxType.__members__:
        raise NotAnEnvelope(f"not an outbox envelope: {PROPERTY_OUTBOX_TX_TYPE} "
                            f"{props[PROPERTY_OUTBOX_TX_TYPE]!r} is not COMMIT or ROLLBACK")
    props.setdefault(PROPERTY_UNIQ_KEY, event_id)
    tags, keys = props.pop(HEADER_TAGS, ""), props.pop(HEADER_KEYS, "")
    return MessageExt(topic=topic, body=body, tags=tags, keys=keys, properties=props,
                      reconsume_times=reconsume_times)


class Verdict(Enum):
    """What a transport does with a delivery once the listener answered."""

    ACK = "ack"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"


def verdict(status: ConsumeStatus, delivery: int, max_reconsume_times: int, *,
            broker_limits: bool) -> Verdict:
    """ACK on success; on ``RECONSUME_LATER`` RETRY, or DEAD_LETTER once ``delivery`` (1-based)
    reached ``max_reconsume_times + 1`` and the broker does not count deliveries itself
    (``broker_limits``: RabbitMQ's ``x-delivery-limit`` dead-letters on its own)."""
    if status is ConsumeStatus.CONSUME_SUCCESS:
        return Verdict.ACK
    if not broker_limits and delivery > max_reconsume_times:
        return Verdict.DEAD_LETTER
    return Verdict.RETRY
