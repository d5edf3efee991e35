"""A relay process for the SIGKILL test: ``python relay_proc.py DB_PATH PREFIX URL``.

Relays the outbox of ``PREFIX`` in the SQLite file ``DB_PATH`` over the transport ``URL`` with a
1.5 s lease, pausing 50 ms after each acknowledged batch before it is marked sent (so a kill lands
between the broker's acknowledgement and the database update). Runs until killed.
"""

from __future__ import annotations

import sys
import time

from txmq import outbox
from txmq.outbox import Relay, RelayConfig, open_transport
from txmq.protocol import Message


def main() -> None:
    db, prefix, url = sys.argv[1:4]
    transport = open_transport(url, consumer_kw={}) if url.startswith("txmq") else open_transport(url)

    class Slow:
        def send_batch(self, msgs: list[Message]) -> object:
            transport.send_batch(msgs)
            time.sleep(0.05)
            return None

    engine = outbox.create_sqlite_engine(db)
    relay = Relay(engine, Slow(), tables=outbox.make_tables(prefix),
                  config=RelayConfig(period_ms=20, batch_size=10, lease_ms=1500, pool_size=2))
    relay.start()
    print("started", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
