"""``txmq tx`` operator commands against a real broker process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from txmq.client import LocalTransactionState, Message, MessageExt, PullConsumer, TransactionProducer
from txmq.testing import run_broker


class _Undecided:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def txmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txmq", "tx", *args], capture_output=True, text=True,
                          timeout=60)


def test_list_show_commit_rollback(tmp_path: Path) -> None:
    with run_broker(tmp_path / "b", topics={"t": 1}, transaction_timeout_ms=600_000) as b, \
            TransactionProducer("pg", b.endpoints, _Undecided()) as tp:
        first = tp.send_message_in_transaction(Message(topic="t", body=b"1", keys="k1"))
        second = tp.send_message_in_transaction(Message(topic="t", body=b"2", keys="k2"))
        listed = json.loads(txmq("list", "--endpoints", b.endpoints, "--json").stdout)
        assert [r["keys"] for r in listed] == ["k1", "k2"]
        assert all(r["state"] == "PENDING" and r["producer_group"] == "pg" for r in listed)
        shown = json.loads(txmq("show", first.msg_id, "--endpoints", b.endpoints, "--json").stdout)
        assert shown["half_offset"] == first.half_offset
        ok = txmq("commit", first.msg_id, "--reason", "INC-1", "--operator", "alice",
                  "--endpoints", b.endpoints)
        assert ok.returncode == 0 and "COMMIT" in ok.stdout
        txmq("rollback", f"half:{second.half_offset}", "--reason", "bad", "--endpoints", b.endpoints)
        again = txmq("rollback", first.msg_id, "--reason", "late", "--endpoints", b.endpoints)
        assert again.returncode == 1 and "TRANSACTION_NOT_FOUND" in again.stdout
        again = txmq("rollback", f"half:{first.half_offset}", "--reason", "late",
                     "--endpoints", b.endpoints)
        assert "COMMIT (already decided)" in again.stdout
        with PullConsumer(b.endpoints) as pc:
            assert [m.body for m in pc.pull("t", 0, 0, 10).messages] == [b"1"]
        stats = json.loads(txmq("stats", "--endpoints", b.endpoints, "--json").stdout)
        assert (stats["COMMIT"], stats["ROLLBACK"], stats["PENDING"]) == (1, 1, 0)
        missing = txmq("show", "no-such-id", "--endpoints", b.endpoints)
        assert missing.returncode == 1 and "TRANSACTION_NOT_FOUND" in missing.stdout
