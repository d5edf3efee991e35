"""Admin commands on a cluster: the master brokers a name server lists (GET_BROKER_CLUSTER_INFO),
each asked on its own with :class:`txmq.client.Admin`, as mqadmin's ``-c CLUSTER`` options do
(``CommandUtil.fetchMasterAddrByClusterName``). A broker that cannot be reached or refuses is
reported by name and the others are still asked (:class:`PerBroker`).

The name server is asked over a plain socket (:func:`namesrv_request`), the only I/O here besides
the Admin clients; picking the masters is :meth:`txmq.protocol.ClusterInfo.masters`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Generic, TypeVar

import typer
from rich.console import Console

from txmq import limits
from txmq.cli._credentials import credential_kw
from txmq.client import Admin
from txmq.errors import BrokerUnavailable, RemoteError, ResponseCode, TxmqError
from txmq.protocol import (
    ClusterInfo,
    Command,
    DeleteTopicFromNamesrvRequestHeader,
    FrameDecoder,
    RequestCode,
    decode_cluster_info,
    encode_command,
    parse_address,
    to_ext,
)

__all__ = ["ClusterName", "PerBroker", "cluster_masters", "delete_in_namesrv", "namesrv_request",
           "on_each"]

ClusterName = Annotated[str, typer.Option(
    "--cluster", "-c", help="With --namesrv-addr: only the brokers of this cluster (default: "
                            "every broker the name server lists).")]
T = TypeVar("T")
_READ_BYTES = 65536
"""Bytes read from the name server's socket at a time."""
CLUSTER_ADMIN_PARALLEL_MAX = 16
"""Brokers asked at once by one command (threads; txmq's own bound, mqadmin asks in turn)."""
_err = Console(stderr=True)


def namesrv_request(namesrv_addr: str, code: int, ext: dict[str, str] | None = None,
                    timeout_ms: int = limits.REQUEST_TIMEOUT_MS) -> Command:
    """One request to the first name server of ``namesrv_addr`` (``host:port[;host:port]``)
    that answers; its response.

    Raises:
        BrokerUnavailable: no name server answered within ``timeout_ms`` each.
        ConfigError: an address that does not parse.
    """
    last: Exception | None = None
    for addr in filter(None, (a.strip() for a in namesrv_addr.split(";"))):
        host, port = parse_address(addr)
        try:
            with socket.create_connection((host, port), timeout=timeout_ms / 1000) as sock:
                sock.sendall(encode_command(Command(code, 1, ext=ext or {})))
                decoder = FrameDecoder()
                while True:
                    data = sock.recv(_READ_BYTES)
                    if not data:
                        raise BrokerUnavailable(f"name server {addr} closed the connection")
                    for cmd in decoder.feed(data):
                        if cmd.is_response and cmd.opaque == 1:
                            return cmd
        except (OSError, TxmqError) as exc:
            last = exc
    raise BrokerUnavailable(f"no name server of {namesrv_addr!r} answered: {last}")


def cluster_masters(namesrv_addr: str, cluster: str = "") -> dict[str, str]:
    """Broker name → master address of every broker of ``cluster`` (all when empty) the name
    servers list. Raises BrokerUnavailable, RemoteError, ConfigError (no such cluster)."""
    r = namesrv_request(namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
    if r.code != ResponseCode.SUCCESS:
        raise RemoteError(r.code, r.remark or "")
    info: ClusterInfo = decode_cluster_info(r.body) if r.body else ClusterInfo()
    return info.masters(cluster)


def delete_in_namesrv(namesrv_addr: str, topic: str, cluster: str = "") -> None:
    """Drop ``topic``'s routes on the name server (DELETE_TOPIC_IN_NAMESRV 216; only those of
    ``cluster``'s brokers when given). Raises BrokerUnavailable, RemoteError."""
    ext = to_ext(DeleteTopicFromNamesrvRequestHeader(topic=topic, cluster_name=cluster or None))
    r = namesrv_request(namesrv_addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, ext)
    if r.code != ResponseCode.SUCCESS:
        raise RemoteError(r.code, r.remark or "")


@dataclass
class PerBroker(Generic[T]):
    """What each broker answered: ``done`` (broker name → result) and ``failed`` (broker name →
    ``"<address>: <reason>"``), both in broker name order."""

    done: dict[str, T] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def report(self) -> None:
        """Print each failure (broker name, address, reason) on stderr."""
        for name, why in self.failed.items():
            _err.print(f"[red]error:[/red] broker {name} ({why})")

    def exit_code(self) -> int:
        """0 when every broker answered, else 1."""
        return 1 if self.failed else 0


def on_each(brokers: dict[str, str], fn: Callable[[str, Admin], T]) -> PerBroker[T]:
    """``fn(name, admin)`` on every broker of ``brokers`` (name → address) at once (at most
    ``CLUSTER_ADMIN_PARALLEL_MAX`` together, so a hung broker costs one request timeout, not
    one per broker), with the running command's credentials; a TxmqError (down, timeout,
    refusal) is recorded in ``failed``. Results are in ``brokers``' order."""
    kw = credential_kw()

    def one(name: str) -> _Done[T] | str:
        try:
            with Admin(endpoints=brokers[name], **kw) as adm:
                return _Done(fn(name, adm))
        except TxmqError as exc:
            return f"{brokers[name]}: {exc}"

    out: PerBroker[T] = PerBroker()
    if not brokers:
        return out
    with ThreadPoolExecutor(min(len(brokers), CLUSTER_ADMIN_PARALLEL_MAX),
                            thread_name_prefix="txmq-cli-broker") as pool:
        answers = list(pool.map(one, brokers))
    for name, got in zip(brokers, answers, strict=True):
        if isinstance(got, _Done):
            out.done[name] = got.value
        else:
            out.failed[name] = str(got)
    return out


@dataclass(frozen=True)
class _Done(Generic[T]):
    value: T
