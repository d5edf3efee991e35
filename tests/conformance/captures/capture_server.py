"""A throwaway RocketMQ remoting stand-in that records every frame: name server and broker on one port.

Not txmq: a minimal, in-memory, standard-library-only imitation, just enough for the RocketMQ C++
client core to route, send, end and check transactions, heartbeat, rebalance, pull, send back and
commit offsets, so that ``record_captures.py`` can save what the client really sends. Nothing here is
durable or checked; wire facts it relies on are RocketMQ's (``RemotingCommand`` JSON header, fastjson
``TopicRouteData``, ``MessageDecoder`` v1 layout, ``ConsumerManageProcessor`` offset rules).

    python capture_server.py PORT OUTDIR [--quote-keys] [--offset-not-found] [--no-route-trace]
                                         [--checkback-after SECONDS]

Writes ``OUTDIR/frames.jsonl``: one record per frame both ways (``dir`` in/out), with the decoded
header, the raw header text, the body (latin-1) and the whole frame in hex.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any

QUEUES = 4
MAGIC_V1 = 0xDAA320A7  # MessageDecoder MESSAGE_MAGIC_CODE (v1: 1-byte topic length)
SUSPEND_CAP_S = 1.0  # answer a long poll after at most this long (RocketMQ holds up to 15 s)
BORN_PORT = 40000

#   MessageExt v1 after TOTALSIZE (MessageDecoder.decode):
#   +-------+-------+--------+------+-----------+------------+---------+------+-----------+
#   | magic | bodyCRC | queueId | flag | queueOffset | physicalOffset | sysFlag | bornTs | bornHost |
#   | i32   | i32   | i32    | i32  | i64       | i64        | i32     | i64  | 4s + i32  |
#   +-------+-------+--------+------+-----------+------------+---------+------+-----------+
#   | storeTs i64 | storeHost 4s + i32 | reconsumeTimes i32 | preparedTxOffset i64 |
#   then bodyLen i32 + body, topicLen u8 + topic, propertiesLen i16 + properties
_MSG_FIXED = struct.Struct(">iiiiqqiq4siq4siiq")


class Server:
    def __init__(self, port: int, out: Path, argv: list[str]) -> None:
        self.port, self.addr = port, f"127.0.0.1:{port}"
        self.quote_keys = "--quote-keys" in argv
        self.offset_not_found = "--offset-not-found" in argv
        self.no_route_trace = "--no-route-trace" in argv
        self.checkback_after = 2.0
        if "--checkback-after" in argv:
            self.checkback_after = float(argv[argv.index("--checkback-after") + 1])
        out.mkdir(parents=True, exist_ok=True)
        self.log_file = (out / "frames.jsonl").open("a", buffering=1)
        self.seq = itertools.count(1)
        self.opaque = itertools.count(1_000_000)
        self.conn_ids = itertools.count(1)
        self.next_offset = 0
        self.commitlog: dict[int, dict[str, Any]] = {}
        self.queues: dict[tuple[str, int], list[int]] = {}
        self.halves: dict[int, dict[str, Any]] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.producers: dict[str, set[Conn]] = {}
        self.consumer_ids: dict[str, set[str]] = {}

    def log(self, rec: dict[str, Any]) -> None:
        self.log_file.write(json.dumps({"n": next(self.seq), **rec}, ensure_ascii=False) + "\n")

    def offset_msg_id(self, off: int) -> str:
        return (socket.inet_aton("127.0.0.1") + struct.pack(">iq", self.port, off)).hex().upper()

    def msg_ext(self, m: dict[str, Any]) -> bytes:
        body, topic = m["body"], m["topic"].encode()
        props = "".join(f"{k}\x01{v}\x02" for k, v in m["props"].items()).encode()
        ip = socket.inet_aton("127.0.0.1")
        fixed = _MSG_FIXED.pack(MAGIC_V1 - (1 << 32), zlib.crc32(body) & 0x7FFFFFFF, m["qid"], m["flag"],
                                m["qoff"], m["off"], m["sysflag"], m["born"], ip, BORN_PORT, m["store"], ip,
                                self.port, m["reconsume"], 0)
        rest = (struct.pack(">i", len(body)) + body + struct.pack(">B", len(topic)) + topic
                + struct.pack(">h", len(props)) + props)
        return struct.pack(">i", 4 + len(fixed) + len(rest)) + fixed + rest

    def store(self, topic: str, qid: int, body: bytes, props: dict[str, str], sysflag: int, born: int,
              reconsume: int = 0, visible: bool = True, flag: int = 0) -> dict[str, Any]:
        off = self.next_offset
        self.next_offset += 100
        m = {"topic": topic, "qid": qid, "body": body, "props": props, "sysflag": sysflag, "born": born,
             "reconsume": reconsume, "off": off, "store": int(time.time() * 1000), "qoff": 0, "flag": flag}
        self.commitlog[off] = m
        if visible:
            q = self.queues.setdefault((topic, qid), [])
            m["qoff"] = len(q)
            q.append(off)
        return m

    def route(self) -> bytes:
        key = '"0"' if self.quote_keys else "0"  # fastjson writes the Long key unquoted
        return ('{"brokerDatas":[{"brokerAddrs":{' + key + ':"' + self.addr + '"},"brokerName":"b",'
                '"cluster":"c"}],"filterServerTable":{},"queueDatas":[{"brokerName":"b","perm":6,'
                f'"readQueueNums":{QUEUES},"topicSysFlag":0,"writeQueueNums":{QUEUES}}}]}}').encode()


def props_parse(s: str) -> dict[str, str]:
    return dict(item.split("\x01", 1) for item in s.split("\x02") if "\x01" in item)


def decode_header(st: int, hdr: bytes) -> dict[str, Any]:
    """JSON (type 0) or ROCKETMQ binary (type 1) RemotingCommand header."""
    if st == 0:
        return dict(json.loads(hdr.decode()))
    code, lang, ver, opaque, flag = struct.unpack_from(">hbhii", hdr, 0)
    p = 13
    (rl,) = struct.unpack_from(">i", hdr, p)
    remark = hdr[p + 4:p + 4 + rl].decode() if rl > 0 else None
    p += 4 + max(rl, 0)
    (el,) = struct.unpack_from(">i", hdr, p)
    p, end, ext = p + 4, p + 4 + el, {}
    while p < end:
        (kl,) = struct.unpack_from(">h", hdr, p)
        k = hdr[p + 2:p + 2 + kl].decode()
        p += 2 + kl
        (vl,) = struct.unpack_from(">i", hdr, p)
        ext[k] = hdr[p + 4:p + 4 + vl].decode()
        p += 4 + vl
    return {"code": code, "language": lang, "version": ver, "opaque": opaque, "flag": flag,
            "remark": remark, "extFields": ext}


class Conn:
    def __init__(self, srv: Server, writer: asyncio.StreamWriter, cid: int) -> None:
        self.srv, self.w, self.id, self.alive = srv, writer, cid, True

    def send(self, header: dict[str, Any], body: bytes = b"") -> None:
        h = json.dumps(header).encode()
        data = struct.pack(">ii", 4 + len(h) + len(body), len(h)) + h + body
        self.srv.log({"conn": self.id, "dir": "out", "header": header, "body": body.decode("latin1"),
                      "hex": data.hex()})
        if self.alive:
            self.w.write(data)

    def reply(self, req: dict[str, Any], code: int = 0, ext: dict[str, str] | None = None,
              body: bytes = b"", remark: str | None = None) -> None:
        if req.get("flag", 0) & 2:
            return
        self.send({"code": code, "flag": 1, "language": "JAVA", "opaque": req["opaque"], "version": 453,
                   "remark": remark, "extFields": ext or {}, "serializeTypeCurrentRPC": "JSON"}, body)


def on_send(c: Conn, h: dict[str, Any], ext: dict[str, str], body: bytes) -> None:
    srv = c.srv
    if h["code"] == 310:  # SendMessageRequestHeaderV2 short names
        ext = {"producerGroup": ext.get("a", ""), "topic": ext.get("b", ""), "queueId": ext.get("e", "0"),
               "sysFlag": ext.get("f", "0"), "bornTimestamp": ext.get("g", "0"), "flag": ext.get("h", "0"),
               "properties": ext.get("i", ""), "reconsumeTimes": ext.get("j", "0")}
    props = props_parse(ext.get("properties") or "")
    tx = props.get("TRAN_MSG") == "true"
    m = srv.store(ext["topic"], int(ext["queueId"]), body, props, int(ext.get("sysFlag") or 0),
                  int(ext["bornTimestamp"]), int(ext.get("reconsumeTimes") or 0), visible=not tx,
                  flag=int(ext.get("flag") or 0))
    if tx:
        srv.halves[m["off"]] = {"msg": m, "group": ext["producerGroup"], "t": time.time(), "settled": None}
    c.reply(h, 0, {"msgId": srv.offset_msg_id(m["off"]), "queueId": str(m["qid"]),
                   "queueOffset": str(m["qoff"]), "transactionId": props.get("UNIQ_KEY", "")})


def on_end(srv: Server, ext: dict[str, str]) -> None:
    half = srv.halves.get(int(ext["commitLogOffset"]))
    if half is None or half["settled"] is not None:
        return
    kind = int(ext["commitOrRollback"])
    if kind == 8:  # TRANSACTION_COMMIT_TYPE
        m = half["msg"]
        props = {k: v for k, v in m["props"].items() if k != "TRAN_MSG"}
        srv.store(m["topic"], m["qid"], m["body"], props, 8, m["born"])
        half["settled"] = "commit"
    elif kind == 12:  # TRANSACTION_ROLLBACK_TYPE
        half["settled"] = "rollback"
    else:
        half["t"] = time.time()


async def checker(srv: Server) -> None:
    """CHECK_TRANSACTION_STATE (39) to the newest live connection of an unsettled half's group."""
    while True:
        await asyncio.sleep(0.5)
        now = time.time()
        for half in list(srv.halves.values()):
            live = [c for c in srv.producers.get(half["group"], set()) if c.alive]
            if half["settled"] is not None or now - half["t"] <= srv.checkback_after or not live:
                continue
            half["t"] = now
            m, c = half["msg"], max(live, key=lambda x: x.id)
            ext = {"topic": m["topic"], "tranStateTableOffset": str(m["off"]),
                   "commitLogOffset": str(m["off"]), "msgId": m["props"].get("UNIQ_KEY", ""),
                   "transactionId": m["props"].get("UNIQ_KEY", ""),
                   "offsetMsgId": srv.offset_msg_id(m["off"])}
            c.send({"code": 39, "flag": 0, "language": "JAVA", "opaque": next(srv.opaque), "version": 453,
                    "remark": None, "extFields": ext, "serializeTypeCurrentRPC": "JSON"}, srv.msg_ext(m))


async def on_pull(c: Conn, h: dict[str, Any], ext: dict[str, str]) -> None:
    srv = c.srv
    key, qoff = (ext["topic"], int(ext["queueId"])), int(ext["queueOffset"])
    deadline = time.time() + min(int(ext.get("suspendTimeoutMillis") or 0) / 1000, SUSPEND_CAP_S)
    while qoff >= len(srv.queues.get(key, [])) and time.time() < deadline:
        await asyncio.sleep(0.05)
    q = srv.queues.get(key, [])
    base = {"suggestWhichBrokerId": "0", "minOffset": "0", "maxOffset": str(len(q))}
    if qoff < len(q):
        batch = q[qoff:qoff + int(ext.get("maxMsgNums") or 32)]
        body = b"".join(srv.msg_ext(srv.commitlog[o]) for o in batch)
        c.reply(h, 0, {**base, "nextBeginOffset": str(qoff + len(batch))}, body)
    else:
        c.reply(h, 19, {**base, "nextBeginOffset": str(qoff)}, remark="no new message")  # PULL_NOT_FOUND


def on_send_back(c: Conn, h: dict[str, Any], ext: dict[str, str]) -> None:
    """CONSUMER_SEND_MSG_BACK: to %RETRY%group, or %DLQ%group once reconsumeTimes >= max (no delay)."""
    m = c.srv.commitlog[int(ext["offset"])]
    group, mx = ext["group"], int(ext.get("maxReconsumeTimes") or 16)
    props = dict(m["props"])
    props.setdefault("RETRY_TOPIC", m["topic"])
    props.setdefault("ORIGIN_MESSAGE_ID", ext.get("originMsgId") or "")
    dlq = m["reconsume"] >= mx or int(ext.get("delayLevel") or 0) < 0
    topic = f"%DLQ%{group}" if dlq else f"%RETRY%{group}"
    c.srv.store(topic, 0, m["body"], props, m["sysflag"], m["born"], m["reconsume"] + 1)
    c.reply(h, 0)


def on_query_offset(c: Conn, h: dict[str, Any], ext: dict[str, str]) -> None:
    key = (ext["consumerGroup"], ext["topic"], int(ext["queueId"]))
    if key in c.srv.offsets:
        c.reply(h, 0, {"offset": str(c.srv.offsets[key])})
    elif c.srv.offset_not_found:
        c.reply(h, 22, remark="Not found, maybe this group consumer boot first")  # QUERY_NOT_FOUND
    else:
        c.reply(h, 0, {"offset": "0"})  # ConsumerManageProcessor: min offset 0 still in memory


async def dispatch(c: Conn, h: dict[str, Any], body: bytes) -> None:
    srv, code = c.srv, h["code"]
    ext = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (h.get("extFields") or {}).items()}
    if code == 105:
        if srv.no_route_trace and ext["topic"].startswith(("rmq_sys_TRACE", "TBW102")):
            c.reply(h, 17, remark=f"No topic route info in name server for the topic: {ext['topic']}")
        else:
            c.reply(h, 0, body=srv.route())
    elif code == 34:
        hb = json.loads(body)
        for p in hb.get("producerDataSet", []):
            srv.producers.setdefault(p["groupName"], set()).add(c)
        for cd in hb.get("consumerDataSet", []):
            srv.consumer_ids.setdefault(cd["groupName"], set()).add(hb["clientID"])
        c.reply(h, 0)
    elif code in (10, 310):
        on_send(c, h, ext, body)
    elif code == 37:
        on_end(srv, ext)
        c.reply(h, 0)
    elif code == 38:
        ids = sorted(srv.consumer_ids.get(ext["consumerGroup"], set()))
        c.reply(h, 0, body=json.dumps({"consumerIdList": ids}).encode())
    elif code == 14:
        on_query_offset(c, h, ext)
    elif code == 15:
        srv.offsets[(ext["consumerGroup"], ext["topic"], int(ext["queueId"]))] = int(ext["commitOffset"])
        c.reply(h, 0)
    elif code == 30:
        c.reply(h, 0, {"offset": str(len(srv.queues.get((ext["topic"], int(ext["queueId"])), [])))})
    elif code == 11:
        await on_pull(c, h, ext)
    elif code == 36:
        on_send_back(c, h, ext)
    elif code == 41:  # LockBatchResponseBody: every requested queue locked
        c.reply(h, 0, body=json.dumps({"lockOKMQSet": json.loads(body)["mqSet"]}).encode())
    else:
        c.reply(h, 0)


async def serve(srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    c = Conn(srv, writer, next(srv.conn_ids))
    tasks: set[asyncio.Future[None]] = set()
    srv.log({"conn": c.id, "dir": "open", "peer": str(writer.get_extra_info("peername"))})
    try:
        while True:
            head = await reader.readexactly(4)
            rest = await reader.readexactly(struct.unpack(">i", head)[0])
            (mark,) = struct.unpack(">I", rest[:4])
            st, hl = mark >> 24, mark & 0xFFFFFF
            hdr, body = rest[4:4 + hl], rest[4 + hl:]
            h = decode_header(st, hdr)
            srv.log({"conn": c.id, "dir": "in", "serialize_type": st, "header_raw": hdr.decode("latin1"),
                     "header": h, "body": body.decode("latin1"), "hex": (head + rest).hex()})
            if not h.get("flag", 0) & 1:
                task = asyncio.ensure_future(dispatch(c, h, body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        c.alive = False
        srv.log({"conn": c.id, "dir": "close"})


async def main(argv: list[str]) -> None:
    srv = Server(int(argv[0]), Path(argv[1]), argv[2:])
    server = await asyncio.start_server(lambda r, w: serve(srv, r, w), "127.0.0.1", srv.port)
    task = asyncio.ensure_future(checker(srv))
    async with server:
        await server.serve_forever()
    task.cancel()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
