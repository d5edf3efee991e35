"""A broker over a MemoryStore, driven by hand: for unit tests and seeded simulations.

No sockets and no clock: the harness owns ``now_ms`` and flushes the store after every request,
so replies are as a SYNC_FLUSH broker would send them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from txmq.broker import Action, Broker, BrokerConfig, Reply, SendTo
from txmq.protocol import (
    PROPERTY_KEYS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Command,
    EndTransactionRequestHeader,
    HeartbeatData,
    MessageExt,
    ProducerData,
    PullMessageRequestHeader,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    decode_message_exts,
    decode_offset_msg_id,
    encode_body,
    encode_properties,
    from_ext,
    to_ext,
)
from txmq.store import MemoryStore, Store

__all__ = ["END_TYPES", "BrokerHarness"]

END_TYPES = {"COMMIT": TRANSACTION_COMMIT_TYPE, "ROLLBACK": TRANSACTION_ROLLBACK_TYPE,
             "UNKNOWN": TRANSACTION_NOT_TYPE}


class BrokerHarness:
    """Drive a :class:`Broker` with plain method calls.

    Args:
        store: defaults to a new MemoryStore (pass the old one to simulate a restart).
        now_ms: the starting time.
        **config: BrokerConfig fields (``topics`` defaults to ``{"t": 2}``).
    """

    def __init__(self, store: Store | None = None, now_ms: int = 1_000_000, **config: Any) -> None:
        config.setdefault("topics", {"t": 2})
        self.config = msgspec.convert(config, BrokerConfig).validate()
        self.store = store if store is not None else MemoryStore()
        self.now_ms = now_ms
        self.broker = Broker(self.config, self.store, now_ms)
        self.sent: list[SendTo] = []
        self._msg_seq = 0

    def request(self, conn: int, code: int, ext: dict[str, str] | None = None,
                body: bytes = b"") -> Command:
        """Handle one request; return its reply (side requests are kept in ``sent``)."""
        actions = self.broker.handle(conn, Command(code=int(code), opaque=1, ext=ext or {},
                                                   body=body), self.now_ms)
        self.store.flush()
        return self._reply(actions)

    def _reply(self, actions: list[Action]) -> Command:
        replies = [a.command for a in actions if isinstance(a, Reply)]
        self.sent += [a for a in actions if isinstance(a, SendTo)]
        assert len(replies) == 1, f"expected one reply, got {actions}"
        return replies[0]

    def heartbeat(self, conn: int, client_id: str, producer_groups: list[str] = (),  # type: ignore[assignment]
                  ) -> Command:
        data = HeartbeatData(client_id=client_id,
                             producer_data_set=[ProducerData(group_name=g) for g in producer_groups])
        return self.request(conn, RequestCode.HEART_BEAT, body=encode_body(data))

    def send(self, conn: int, topic: str, body: bytes, *, group: str = "pg",
             transactional: bool = False, queue_id: int = 0, keys: str = "",
             properties: dict[str, str] | None = None) -> Command:
        self._msg_seq += 1
        props = {PROPERTY_UNIQ_KEY: f"M{self._msg_seq:08d}", **(properties or {})}
        if transactional:
            props[PROPERTY_TRANSACTION_PREPARED] = "true"
        if keys:
            props[PROPERTY_KEYS] = keys
        h = SendMessageRequestHeader(producer_group=group, topic=topic, queue_id=queue_id,
                                     properties=encode_properties(props),
                                     born_timestamp=self.now_ms)
        return self.request(conn, RequestCode.SEND_MESSAGE, to_ext(h), body)

    def end(self, conn: int, half: Command, outcome: str, *, group: str = "pg",
            from_check: bool = False) -> Command:
        sent = from_ext(half.ext, SendMessageResponseHeader)
        h = EndTransactionRequestHeader(
            producer_group=group, tran_state_table_offset=sent.queue_offset,
            commit_log_offset=decode_offset_msg_id(sent.msg_id)[1],
            commit_or_rollback=END_TYPES[outcome], from_transaction_check=from_check,
            msg_id=sent.transaction_id or "")
        return self.request(conn, RequestCode.END_TRANSACTION, to_ext(h))

    def pull(self, topic: str, queue_id: int = 0, offset: int = 0, group: str = "cg",
             max_nums: int = 1000) -> list[MessageExt]:
        h = PullMessageRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id,
                                     queue_offset=offset, max_msg_nums=max_nums)
        r = self.request(0, RequestCode.PULL_MESSAGE, to_ext(h))
        return decode_message_exts(r.body)

    def all_messages(self, topic: str) -> list[MessageExt]:
        """Every durable message of every queue of ``topic``."""
        out: list[MessageExt] = []
        for qid in self.store.queue_ids(topic):
            out += self.pull(topic, qid)
        return out

    def tick(self, advance_ms: int = 0) -> list[SendTo]:
        """Advance the clock and run the periodic work; returns the check-backs sent."""
        self.now_ms += advance_ms
        actions = self.broker.tick(self.now_ms)
        self.store.flush()
        sent = [a for a in actions if isinstance(a, SendTo)]
        self.sent += sent
        return sent

    def close(self, conn: int) -> None:
        self.sent += [a for a in self.broker.connection_closed(conn) if isinstance(a, SendTo)]
