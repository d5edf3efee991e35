"""The broker's asyncio shell: sockets, timers, group-commit fsync, long-polling, metrics.

Everything stateful and testable lives in :class:`~txmq.broker.Broker`; this module only moves
bytes, keeps time and runs ``fsync`` in a thread so that concurrent sends share one flush (group
commit): a reply that needs durability waits until the store's ``flushed_offset`` passes its record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import count

from txmq import limits
from txmq.broker._actions import Action, Close, Hold, Reply, SendTo
from txmq.broker._broker import Broker
from txmq.broker._config import BrokerConfig
from txmq.errors import ProtocolError, ResponseCode
from txmq.protocol import FLAG_RESPONSE, Command, FrameDecoder, encode_command
from txmq.store import FileStore, Store

__all__ = ["BrokerServer", "run_server"]

log = logging.getLogger("txmq.broker.server")
_READ_BYTES = 256 * 1024


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerServer:
    """Serve one :class:`Broker` over TCP.

    Args:
        config: broker configuration (listen address, data dir, flush mode, timings).
        store: the store to use; a :class:`FileStore` in ``config.data_dir`` when omitted.
    """

    def __init__(self, config: BrokerConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store if store is not None else FileStore(config.data_dir)
        self.broker = Broker(config, self.store, _now_ms())
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._ids = count(1)
        self._waiting: deque[tuple[int, Reply]] = deque()
        self._holds: dict[tuple[str, int], list[Hold]] = {}
        self._dirty = asyncio.Event()
        self._flush_pool = ThreadPoolExecutor(1, thread_name_prefix="txmq-flush")
        self._tasks: list[asyncio.Task[None]] = []
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        """Listen and start the flusher and the ticker."""
        self._server = await asyncio.start_server(self._serve, self.config.host, self.config.port,
                                                  limit=limits.FRAME_SIZE_MAX_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        self._tasks = [asyncio.create_task(self._flusher()), asyncio.create_task(self._ticker())]
        if self.config.metrics_port:
            from txmq.broker._metrics import start_metrics

            start_metrics(self.broker, self.config.metrics_port)
        log.info("txmq broker listening on %s:%d (data %s, %s)", self.config.host, self.port,
                 self.config.data_dir, self.config.flush_disk_type)

    async def close(self) -> None:
        """Stop listening, flush, persist offsets and close the store."""
        if self._server is not None:
            self._server.close()
        for t in self._tasks:
            t.cancel()
        for w in list(self._writers.values()):
            w.close()
        self.broker.persist_offsets()
        self.store.close()
        self._flush_pool.shutdown(wait=True)

    # -- connections ------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        self._writers[conn] = writer
        decoder = FrameDecoder()
        try:
            while data := await reader.read(_READ_BYTES):
                try:
                    cmds = decoder.feed(data)
                except ProtocolError as exc:
                    log.warning("connection %d: %s; closing", conn, exc)
                    bad = Command(code=ResponseCode.MALFORMED_REQUEST, flags=FLAG_RESPONSE,
                                  remark=str(exc))
                    writer.write(encode_command(bad))
                    break
                for cmd in cmds:
                    if not cmd.is_response:
                        self._apply(self.broker.handle(conn, cmd, _now_ms()))
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.pop(conn, None)
            self._apply(self.broker.connection_closed(conn))
            with contextlib.suppress(Exception):
                writer.close()

    def _write(self, conn: int, cmd: Command) -> None:
        w = self._writers.get(conn)
        if w is None or w.is_closing():
            return
        try:
            w.write(encode_command(cmd))
        except ProtocolError as exc:  # e.g. a response too large for a frame
            log.error("cannot encode reply on connection %d: %s", conn, exc)
            w.write(encode_command(cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))))

    def _apply(self, actions: list[Action]) -> None:
        sync = self.config.flush_disk_type == "SYNC_FLUSH"
        for a in actions:
            if isinstance(a, Reply):
                if sync and a.durable_offset > self.store.flushed_offset:
                    self._waiting.append((a.durable_offset, a))
                else:
                    self._write(a.conn, a.command)
            elif isinstance(a, SendTo):
                self._write(a.conn, a.command)
            elif isinstance(a, Hold):
                self._holds.setdefault((a.topic, a.queue_id), []).append(a)
            elif isinstance(a, Close):
                w = self._writers.get(a.conn)
                if w is not None:
                    w.close()
        if self.store.write_offset > self.store.flushed_offset:
            self._dirty.set()

    # -- group commit -----------------------------------------------------------------------------
    async def _flusher(self) -> None:
        loop = asyncio.get_running_loop()
        sync = self.config.flush_disk_type == "SYNC_FLUSH"
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if not sync:
                await asyncio.sleep(self.config.flush_interval_ms / 1000)
            keys, self.broker.touched = self.broker.touched, set()
            try:
                flushed = await loop.run_in_executor(self._flush_pool, self.store.flush)
            except OSError:
                log.exception("fsync failed; acknowledgements held back")
                await asyncio.sleep(0.1)
                self._dirty.set()
                continue
            while self._waiting and self._waiting[0][0] <= flushed:
                _, reply = self._waiting.popleft()
                self._write(reply.conn, reply.command)
            self._wake(keys)
            if self.store.write_offset > flushed:
                self._dirty.set()

    def _wake(self, keys: set[tuple[str, int]]) -> None:
        now = _now_ms()
        for key in keys:
            for h in self._holds.pop(key, []):
                if h.conn in self._writers:
                    self._apply(self.broker.handle(h.conn, h.request, now))

    async def _ticker(self) -> None:
        last_persist = _now_ms()
        while True:
            await asyncio.sleep(limits.SCHEDULE_TICK_MS / 1000)
            now = _now_ms()
            self._apply(self.broker.tick(now))
            self._expire_holds(now)
            if now - last_persist >= limits.CONSUMER_OFFSET_FLUSH_INTERVAL_MS:
                last_persist = now
                try:
                    self.broker.persist_offsets()
                except OSError:
                    log.exception("could not persist consumer offsets")

    def _expire_holds(self, now: int) -> None:
        for key in list(self._holds):
            keep = []
            for h in self._holds[key]:
                if h.conn not in self._writers:
                    continue
                if h.deadline_ms <= now:
                    self._apply(self.broker.expire_hold(h.conn, h.request))
                else:
                    keep.append(h)
            if keep:
                self._holds[key] = keep
            else:
                del self._holds[key]


async def run_server(config: BrokerConfig, ready: asyncio.Event | None = None,
                     port_file: str | None = None) -> None:
    """Run a broker until cancelled or sent SIGINT/SIGTERM."""
    import signal
    from pathlib import Path

    server = BrokerServer(config)
    await server.start()
    if port_file:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(str(server.port))
        tmp.replace(port_file)
    print(f"txmq broker listening on {config.host}:{server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await server.close()
