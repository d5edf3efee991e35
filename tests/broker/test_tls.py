"""TLS on real broker processes over TCP (issue 16 item 3), with certificates made by ``openssl`` at
test time: an ``enforcing`` broker closes a plaintext remoting connection (nothing stored), fails a
plaintext gRPC call and a plaintext metrics scrape, and serves txmq's SDK (sync and asyncio: send,
consume, transaction), a gRPC client and an HTTPS scrape over TLS; a ``permissive`` broker serves
plaintext and TLS clients on one remoting port; ACL and TLS together; client certificates; the
``[tls]`` table's errors."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from txmq.broker import load_config
from txmq.broker.acl import Accounts, User, UserType, save_accounts
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.broker.grpc.pb import service_pb2_grpc as psg
from txmq.client import (
    Admin,
    AsyncProducer,
    LocalTransactionState,
    Message,
    Producer,
    PullConsumer,
    TransactionProducer,
)
from txmq.errors import BrokerUnavailable, ConfigError, RemoteError, ResponseCode
from txmq.protocol import Command, RequestCode, SendMessageRequestHeaderV2, encode_command, to_ext
from txmq.testing import BrokerProcess, TestCertificates, free_port, make_test_certificates, run_broker

pytestmark = pytest.mark.slow

TOPICS = {"orders": 2, "tx": 1}
ROOT = {"access_key": "root", "secret_key": "root-sk"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    return make_test_certificates(tmp_path_factory.mktemp("certs"))


def _tls(certs: TestCertificates, mode: str, **extra: str) -> dict[str, str]:
    return {"server_mode": mode, "cert_file": str(certs.cert_file),
            "key_file": str(certs.key_file), **extra}


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory: pytest.TempPathFactory,
              certs: TestCertificates) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("enforcing"), topics=TOPICS, grpc_port=free_port(),
                    metrics_port=free_port(), tls=_tls(certs, "enforcing"),
                    transaction_timeout_ms=300, transaction_check_interval_ms=300) as b:
        yield b


def tls_kw(certs: TestCertificates) -> dict[str, Any]:
    return {"tls": True, "tls_ca_file": str(certs.ca_file)}


def stored(b: BrokerProcess, certs: TestCertificates, **kw: Any) -> dict[str, int]:
    with Admin(b.endpoints, **tls_kw(certs), **kw) as a:
        return {t: sum(q.max_offset for q in a.topic_stats(t).offset_table) for t in TOPICS}


def _send_frame() -> bytes:
    ext = to_ext(SendMessageRequestHeaderV2(producer_group="pg", topic="orders", queue_id=0,
                                            born_timestamp=int(time.time() * 1000)))
    return encode_command(Command(RequestCode.SEND_MESSAGE_V2, 1, ext=ext, body=b"plaintext"))


def _recv_all(s: socket.socket) -> bytes:
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


# -- enforcing: every door refuses plaintext ------------------------------------------------------
def test_remoting_closes_a_plaintext_frame_and_stores_nothing(enforcing: BrokerProcess,
                                                              certs: TestCertificates) -> None:
    host, port = enforcing.endpoints.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_send_frame())
        assert _recv_all(s) == b""  # closed without an answer
    assert stored(enforcing, certs)["orders"] == 0
    assert "closed a plaintext connection" in enforcing.log_path.read_text()


def test_the_sdk_without_tls_is_refused(enforcing: BrokerProcess) -> None:
    with pytest.raises(BrokerUnavailable):
        Producer("pg", enforcing.endpoints).start()


def test_the_sdk_refuses_a_certificate_of_another_ca(enforcing: BrokerProcess,
                                                     certs: TestCertificates) -> None:
    p = Producer("pg", enforcing.endpoints, tls=True, tls_ca_file=str(certs.other_ca_file))
    with pytest.raises(BrokerUnavailable, match="certificate verify failed"):
        p.start()
    p.shutdown()
    with pytest.raises(BrokerUnavailable, match="certificate verify failed"):  # system CAs
        Producer("pg", enforcing.endpoints, tls=True).start()


def _grpc_route(target: str, creds: grpc.ChannelCredentials | None) -> ps.QueryRouteResponse:
    channel = (grpc.secure_channel(target, creds) if creds is not None
               else grpc.insecure_channel(target))
    with channel:
        stub = psg.MessagingServiceStub(channel)
        req = ps.QueryRouteRequest(topic=pd.Resource(name="orders"))
        return stub.QueryRoute(req, metadata=(("x-mq-client-id", "tls-test"),), timeout=5)


def test_grpc_refuses_plaintext_and_serves_tls(enforcing: BrokerProcess,
                                               certs: TestCertificates) -> None:
    target = f"127.0.0.1:{enforcing.config['grpc_port']}"
    with pytest.raises(grpc.RpcError) as info:
        _grpc_route(target, None)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_file.read_bytes())
    r = _grpc_route(target, creds)
    assert r.status.code == pd.OK and len(r.message_queues) >= 2


def test_metrics_refuses_http_and_serves_https(enforcing: BrokerProcess,
                                               certs: TestCertificates) -> None:
    port = enforcing.config["metrics_port"]
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
    ctx = ssl.create_default_context(cafile=str(certs.ca_file))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10,
                                context=ctx) as r:
        assert r.status == 200 and b"rocketmq_" in r.read()


# -- the SDK over TLS -----------------------------------------------------------------------------
class _Commit:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def test_the_sdk_sends_consumes_and_commits_over_tls(enforcing: BrokerProcess,
                                                     certs: TestCertificates) -> None:
    before = stored(enforcing, certs)
    with Producer("pg", enforcing.endpoints, **tls_kw(certs)) as p:
        r = p.send(Message(topic="orders", body=b"secret", keys="k1"), queue_id=1)
    with TransactionProducer("tpg", enforcing.endpoints, _Commit(), **tls_kw(certs)) as tp:
        t = tp.send_message_in_transaction(Message(topic="tx", body=b"tx-body", keys="t1"))
    assert t.outcome == "COMMIT"
    with PullConsumer(enforcing.endpoints, "tls-ledger", **tls_kw(certs)) as c:
        got = c.pull("orders", 1, r.queue_offset)
        txs = c.pull("tx", 0, before["tx"])
    assert [m.body for m in got.messages] == [b"secret"]
    assert [m.body for m in txs.messages] == [b"tx-body"]


def test_the_async_sdk_over_tls_by_host_name(enforcing: BrokerProcess,
                                             certs: TestCertificates) -> None:
    async def go() -> int:
        p = AsyncProducer("pg", f"localhost:{enforcing.port}", **tls_kw(certs))
        await p.start()
        try:
            return (await p.send(Message(topic="orders", body=b"a"), queue_id=0)).queue_offset
        finally:
            await p.shutdown()

    assert asyncio.run(go()) >= 0


def test_tls_options_need_tls() -> None:
    with pytest.raises(ConfigError, match="need tls=True"):
        Producer("pg", "127.0.0.1:1", tls_ca_file="ca.pem")
    with pytest.raises(ConfigError, match="tls_ca_file"):
        Producer("pg", "127.0.0.1:1", tls=True, tls_ca_file="/nonexistent/ca.pem")


# -- permissive: both on one port -----------------------------------------------------------------
def test_permissive_serves_plaintext_and_tls_on_one_port(tmp_path: Path,
                                                         certs: TestCertificates) -> None:
    with run_broker(tmp_path / "b", topics=TOPICS, tls=_tls(certs, "permissive")) as b:
        with Producer("pg", b.endpoints) as plain, Producer("pg", b.endpoints,
                                                            **tls_kw(certs)) as secure:
            plain.send(Message(topic="orders", body=b"plain"), queue_id=0)
            secure.send(Message(topic="orders", body=b"tls"), queue_id=0)
        with PullConsumer(b.endpoints, "g") as c:
            got = c.pull("orders", 0, 0)
        assert sorted(m.body for m in got.messages) == [b"plain", b"tls"]


# -- ACL and TLS together -------------------------------------------------------------------------
def test_acl_and_tls_together(tmp_path: Path, certs: TestCertificates) -> None:
    acl = tmp_path / "acl.toml"
    save_accounts(acl, Accounts({"root": User("root", "root-sk", UserType.SUPER)}))
    with run_broker(tmp_path / "b", topics=TOPICS, acl_enable=True, acl_file=str(acl),
                    tls=_tls(certs, "enforcing")) as b:
        with Producer("pg", b.endpoints, **ROOT, **tls_kw(certs)) as p:
            p.send(Message(topic="orders", body=b"both"), queue_id=0)
        with pytest.raises(RemoteError) as info:
            Producer("pg", b.endpoints, **tls_kw(certs)).start()
        assert info.value.response_code == ResponseCode.NO_PERMISSION
        with pytest.raises(BrokerUnavailable):  # the right key, but plaintext
            Producer("pg", b.endpoints, **ROOT).start()
        assert stored(b, certs, **ROOT)["orders"] == 1


# -- client certificates --------------------------------------------------------------------------
def _handshake(b: BrokerProcess, certs: TestCertificates, with_cert: bool) -> bytes:
    ctx = ssl.create_default_context(cafile=str(certs.ca_file))
    if with_cert:
        ctx.load_cert_chain(certs.client_cert_file, certs.client_key_file)
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(encode_command(Command(RequestCode.GET_ROUTEINFO_BY_TOPIC, 7,
                                         ext={"topic": "orders"})))
        return s.recv(65536)


def test_need_client_auth_require(tmp_path: Path, certs: TestCertificates) -> None:
    tls = _tls(certs, "enforcing", ca_file=str(certs.ca_file), need_client_auth="require")
    with run_broker(tmp_path / "b", topics=TOPICS, tls=tls) as b:
        assert _handshake(b, certs, with_cert=True)  # an answer
        try:  # TLS 1.3: the client's handshake ends before the server checks its certificate
            refused = _handshake(b, certs, with_cert=False)
        except (ssl.SSLError, ConnectionError):
            refused = b""
        assert refused == b""


# -- the [tls] table ------------------------------------------------------------------------------
@pytest.mark.parametrize(("table", "error"), [
    ({"server_mode": "enforcing"}, "tls.cert_file is required"),
    ({"server_mode": "strict"}, "server_mode"),
    ({"cert_file": "/nonexistent.pem"}, "tls.cert_file: cannot read /nonexistent.pem"),
    ({"key_file": "CA"}, "not a PEM certificate chain"),
    ({"need_client_auth": "require"}, "needs tls.ca_file"),
    ({"ca_file": "KEY"}, "tls.ca_file"),
], ids=["no-cert", "bad-mode", "missing-file", "key-mismatch", "auth-without-ca", "bad-ca"])
def test_the_tls_table_is_checked(tmp_path: Path, certs: TestCertificates,
                                  table: dict[str, str], error: str) -> None:
    files = {"CA": str(certs.ca_file), "KEY": str(certs.key_file)}
    full = {**_tls(certs, "enforcing"), **table} if "server_mode" not in table else table
    full = {k: files.get(v, v) for k, v in full.items()}
    if table.get("key_file") == "CA":
        full["key_file"] = str(certs.client_key_file)  # a key that is not the certificate's
    cfg = tmp_path / "broker.toml"
    cfg.write_text("[tls]\n" + "".join(f'{k} = "{v}"\n' for k, v in full.items()))
    with pytest.raises(ConfigError, match=error):
        load_config(cfg)


def test_disabled_needs_no_files() -> None:
    assert load_config(None).tls.server_mode == "disabled"
