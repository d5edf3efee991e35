"""One smoke test per extra set (issue 27, item 4): the wheel in a fresh virtualenv with that extra
alone (``venv("outbox")`` …, see conftest.py) does one small real thing with what the extra
provides, and lacks what it should not have: proof that the wheel's ``Requires-Dist`` gives each
extra what its code imports (an import that works only because ``all`` is installed would fail here).

The core and ``broker`` sets are in test_extras.py. The servers are the machine's, as for the outbox
contract tests (``.ci/services`` starts them; an unreachable one fails the test, never skips it):
PostgreSQL 127.0.0.1:5432, MariaDB :3306, RabbitMQ :5672 (vhost ``txmq-test``), NATS :4222; the
``TXMQ_TEST_*_URL`` variables override them.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from packaging_helpers import broker, distributions, run, txmq

from txmq.testing import free_port, wait_until

Venv = Callable[[str], Path]
SERVERS = {
    "postgresql": os.environ.get("TXMQ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mysql": os.environ.get("TXMQ_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    "rabbitmq": os.environ.get("TXMQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/txmq-test"),
    "nats": os.environ.get("TXMQ_TEST_NATS_URL", "nats://127.0.0.1:4222"),
}
CONSOLE_START_TIMEOUT_S = 60
"""Longest ``txmq console`` may take to answer HTTP."""

PUT_AND_RELAY = """
import json, sys, time
import sqlalchemy as sa
from txmq import outbox
from txmq.client import ConsumeStatus, Message

url, topic, transport = sys.argv[1:]
engine = outbox.create_sqlite_engine(url) if not "://" in url else sa.create_engine(url)
tables = outbox.make_tables(f"smoke_{topic.replace('-', '_')}_")
outbox.init_db(engine, tables)
received = []
class Collect:  # a sender that keeps what it is given
    def send_batch(self, msgs):
        received.extend(msgs)
def listener(msgs):
    received.extend(msgs)
    return ConsumeStatus.CONSUME_SUCCESS
try:
    with engine.begin() as conn:  # the business transaction
        outbox.put_message(conn, Message(topic=topic, body=b'{"id": 42}'), event_type="ORDER_CREATED",
                           biz_key="42", app_id="smoke", tables=tables)
    sender = outbox.open_transport(transport) if transport else Collect()
    if transport:  # a consumer group on the broker first, so that the message has somewhere to go
        sender.ensure_topic(topic)
        subscription = sender.subscribe("smoke", topic, listener, max_reconsume_times=0)
        subscription.start()
    outbox.Relay(engine, sender, tables=tables).run_once()
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        time.sleep(0.05)
    if transport:
        subscription.shutdown()
        sender.close()
    with engine.connect() as conn:
        events = outbox.outbox_status(conn, tables).events
    print(json.dumps({"driver": engine.dialect.driver, "events": events,
                      "received": [m.body.decode() for m in received]}))
finally:
    outbox.drop_tables(engine, tables)
"""
"""``python -c PUT_AND_RELAY URL TOPIC TRANSPORT``: an outbox event put in a transaction on the
database at URL (a path: SQLite), relayed once to TRANSPORT's broker and consumed back from it (or,
TRANSPORT "", handed to a list); its status and what arrived."""


def _put_and_relay(python: Path, url: str, transport: str = "") -> dict[str, object]:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    out: dict[str, object] = json.loads(run(python, PUT_AND_RELAY, url, topic, transport).stdout)
    assert out["events"] == {"COMMIT": {"PRODUCE_PROCESSED": 1}}, out
    assert out["received"] == ['{"id": 42}'], out
    return out


def test_outbox_puts_and_relays_on_sqlite(venv: Venv, tmp_path: Path) -> None:
    python = venv("outbox")
    assert not {"typer", "pyspark", "psycopg", "pymysql", "aio-pika", "nats-py", "fastapi",
                "opentelemetry-api", "grpcio"} & distributions(python)
    assert _put_and_relay(python, str(tmp_path / "app.db"))["driver"] == "pysqlite"


def test_the_outbox_command_runs_with_broker_and_outbox_and_names_a_missing_driver(
        venv: Venv, tmp_path: Path) -> None:
    python = venv("broker,outbox")
    db = f"sqlite:///{tmp_path / 'app.db'}"
    for args in (("init-db", db), ("status", db)):
        proc = txmq(python, "outbox", *args)
        assert proc.returncode == 0, proc.stderr
    for args, extra in [(("status", SERVERS["postgresql"]), "postgresql"),
                        (("relay", db, "--transport", SERVERS["rabbitmq"]), "rabbitmq")]:
        proc = txmq(python, "outbox", *args)
        assert proc.returncode == 2 and f"pip install 'txmq[{extra}]'" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("extra", "driver", "not_there"), [
    ("postgresql", "psycopg", "pymysql"), ("mysql", "pymysql", "psycopg")])
def test_a_database_extra_puts_and_relays_on_its_server(venv: Venv, extra: str, driver: str,
                                                        not_there: str) -> None:
    python = venv(extra)
    assert not {not_there, "typer", "pyspark"} & distributions(python)
    assert _put_and_relay(python, SERVERS[extra])["driver"] == driver


@pytest.mark.parametrize(("extra", "not_there"), [("rabbitmq", "nats-py"), ("nats", "aio-pika")])
def test_a_transport_extra_relays_over_its_broker(venv: Venv, tmp_path: Path, extra: str,
                                                  not_there: str) -> None:
    python = venv(extra)
    assert not {not_there, "typer", "pyspark"} & distributions(python)
    _put_and_relay(python, str(tmp_path / "app.db"), SERVERS[extra])


def test_spark_builds_an_arrow_batch_from_a_pull_body_and_reconcile_names_outbox(venv: Venv) -> None:
    """No Java needed: the source's decoder of pull replies (numpy index, Arrow columns) and its
    PySpark data source class; reconcile's database side needs the ``outbox`` extra."""
    python = venv("spark")
    assert not {"typer", "sqlalchemy", "fastapi", "grpcio", "crc32c"} & distributions(python)
    proc = run(python, """
import txmq.spark
from txmq.errors import MissingExtra
from txmq.protocol import MessageExt, encode_message_exts
from txmq.spark._arrow import COLUMNAR_MIN_RECORDS, pull_body_to_record_batch
n = COLUMNAR_MIN_RECORDS + 72  # the columnar path (numpy) takes it
body = encode_message_exts(MessageExt(topic="orders", body=f"order {i}".encode(), queue_id=1,
                                      queue_offset=i, properties={"KEYS": str(i)}) for i in range(n))
got = pull_body_to_record_batch(body)
assert got.batch.num_rows == n and list(got.queue_offsets) == list(range(n)), got.queue_offsets
assert got.batch.column("body")[7].as_py() == b"order 7" and got.queues == {("orders", 1)}
assert txmq.spark.TxmqDataSource.name() == txmq.spark.SOURCE_FORMAT
import txmq.spark.reconcile
try:
    txmq.spark.reconcile.reconcile(None, endpoints="127.0.0.1:1", topic="t", db_url="sqlite://",
                                   table="t", key_column="k")
except MissingExtra as exc:
    print(exc.extra)
""")
    assert proc.stdout.split() == ["outbox"]


@pytest.fixture(scope="module")
def console(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``txmq console`` from a ``txmq[console]`` virtualenv over a broker from the same one; its URL."""
    python = venv("console")
    tmp = tmp_path_factory.mktemp("console")
    with broker(python, tmp / "broker") as broker_port:
        port = free_port()
        proc = subprocess.Popen([python.parent / "txmq", "console", "--port", str(port), "--broker",
                                 f"127.0.0.1:{broker_port}", "--log-level", "warning"],
                                stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _answers(url) or proc.poll() is not None, timeout_s=CONSOLE_START_TIMEOUT_S)
            assert proc.poll() is None, proc.communicate()[1]
            yield url
        finally:
            proc.terminate()
            proc.communicate(timeout=30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/openapi.json", timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def test_console_serves_its_pages_and_api(venv: Venv, console: str, tmp_path: Path) -> None:
    python = venv("console")
    assert not {"pyspark", "sqlalchemy", "grpcio", "opentelemetry-sdk"} & distributions(python)
    with urllib.request.urlopen(console + "/api/openapi.json", timeout=10) as r:
        assert any(p.startswith("/api/") for p in json.load(r)["paths"])
    with urllib.request.urlopen(console + "/topics", timeout=30) as r:
        assert r.headers["content-type"].startswith("text/html")
        assert "smoke" in r.read().decode()  # the broker's topic
    outbox_page = txmq(python, "console", "--port", "0", "--outbox-url", f"sqlite:///{tmp_path / 'a.db'}")
    assert outbox_page.returncode == 2 and "pip install 'txmq[outbox]'" in outbox_page.stderr


def test_grpc_door_answers_a_route_query(venv: Venv, tmp_path: Path) -> None:
    python = venv("grpc")
    assert not {"pyspark", "sqlalchemy", "fastapi"} & distributions(python)
    grpc_port = free_port()
    with broker(python, tmp_path, "--grpc-port", str(grpc_port)):
        proc = run(python, f"""
import grpc
from txmq.broker.grpc.pb import definition_pb2 as d, service_pb2 as s, service_pb2_grpc as g
with grpc.insecure_channel("127.0.0.1:{grpc_port}") as channel:
    grpc.channel_ready_future(channel).result(timeout=30)
    r = g.MessagingServiceStub(channel).QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="smoke")),
                                                   metadata=(("x-mq-client-id", "smoke"),), timeout=10)
print(d.Code.Name(r.status.code), len(r.message_queues))
""")
    assert proc.stdout.split()[0] == "OK" and int(proc.stdout.split()[1]) >= 1, proc.stdout


def test_tracing_propagates_trace_context_without_the_sdk(venv: Venv) -> None:
    python = venv("tracing")
    assert not {"opentelemetry-sdk", "typer", "sqlalchemy"} & distributions(python)
    proc = run(python, """
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
import txmq.tracing
ctx = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=False,
                  trace_flags=TraceFlags(TraceFlags.SAMPLED))
props = {}
with trace.use_span(NonRecordingSpan(ctx)):
    assert txmq.tracing.Tracing().inject(props)
got = trace.get_current_span(txmq.tracing.Tracing().extract(props)).get_span_context()
assert got.trace_id == ctx.trace_id and not txmq.tracing.Tracing().active  # the API's no-op provider
print(props[txmq.tracing.TRACEPARENT])
""")
    assert proc.stdout.strip() == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_otlp_writes_the_spans_of_txmq_tracing_to_an_otlp_json_file(venv: Venv, tmp_path: Path) -> None:
    python = venv("otlp")
    assert not {"typer", "sqlalchemy", "pyspark"} & distributions(python)
    proc = run(python, """
import sys
from pathlib import Path
import txmq.tracing
from txmq.demo.traces import read_spans, start_tracing
path = Path(sys.argv[1])
provider = start_tracing(path, "smoke")
props = {}
with txmq.tracing.Tracing().send_span("send", "orders", [props]) as span:
    assert span is not None
provider.shutdown()
(s,) = read_spans([path])
print(s.name, s.kind, s.service, props["traceparent"].split("-")[1] == s.trace_id)
""", str(tmp_path / "traces.jsonl"))
    assert proc.stdout.split() == ["send", "orders", "PRODUCER", "smoke", "True"]


def test_demo_generates_tpch_orders_and_its_command_loads(venv: Venv, tmp_path: Path) -> None:
    python = venv("demo")
    assert not {"grpcio", "fastapi", "httpx", "playwright", "psycopg", "pymysql"} & distributions(python)
    proc = run(python, """
import sys
from pathlib import Path
from txmq.demo import ledger, order_service, orderdb, spark_pipeline, tpch
orders = tpch.load_orders(tpch.generate(0.001, Path(sys.argv[1])))
print(len(orders), sum(len(o.lineitems) for o in orders) > len(orders))
""", str(tmp_path))
    assert proc.stdout.split() == ["1500", "True"]
    help_ = txmq(python, "demo", "--help")
    assert help_.returncode == 0 and "--sf" in help_.stdout, help_.stderr


def test_bench_loads_every_benchmark(venv: Venv) -> None:
    python = venv("bench")
    assert {"httpx", "playwright", "grpcio", "pyspark"} <= distributions(python)
    proc = run(python, """
import typer
from txmq.cli import app  # every command and benchmark, imported
print(" ".join(typer.main.get_command(app).commands["bench"].commands))
""")
    assert proc.stdout.split() == ["consume", "outbox", "send", "spark", "tx", "grpc", "tracing", "console"]
