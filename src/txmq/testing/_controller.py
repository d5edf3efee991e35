"""A ``txmq controller`` subprocess for tests (docs/controller.md)."""

from __future__ import annotations

import os
from pathlib import Path

from txmq.testing._process import ServerProcess

__all__ = ["ControllerProcess"]


class ControllerProcess(ServerProcess):
    """One controller of a Raft group: ``txmq controller --host H --port P --raft-address R
    --raft-peers R2,R3 --store-dir work_dir``. ``addr`` is ``host:port`` (the remoting port,
    read from ``work_dir/controller.port``; port 0 picks a free one at the first start and keeps
    it across restarts). With ``netns``, it runs inside that network namespace
    (``ip netns exec``; a test host of :class:`txmq.testing.Hosts`). With ``access_key`` /
    ``secret_key`` it signs its role-change pushes (passed in the environment,
    ``TXMQ_ACCESS_KEY`` / ``TXMQ_SECRET_KEY``, not on its command line).
    """

    def __init__(self, work_dir: Path, host: str, port: int, raft_address: str,
                 raft_peers: list[str], netns: str | None = None,
                 log_path: Path | None = None, *, access_key: str = "",
                 secret_key: str = "") -> None:
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.raft_address, self.raft_peers = raft_address, raft_peers
        env = ({**os.environ, "TXMQ_ACCESS_KEY": access_key, "TXMQ_SECRET_KEY": secret_key}
               if access_key else None)
        super().__init__("controller", log_path or self.work_dir / "controller.log", port,
                         env=env, host=host, netns=netns)

    def start(self) -> None:
        """Start the process and wait until it listens. Raises BrokerUnavailable."""
        self._launch(["controller", "--raft-address", self.raft_address,
                      "--raft-peers", ",".join(self.raft_peers), "--store-dir",
                      str(self.work_dir)], self.work_dir / "controller.port")
