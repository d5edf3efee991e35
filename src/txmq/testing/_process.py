"""A server subprocess of txmq's own (broker, name server) that writes the port it bound to a file:
started and waited for, SIGKILLed, stopped. Shared by :class:`txmq.testing.BrokerProcess` and
:class:`txmq.testing.NamesrvProcess`."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from txmq.errors import BrokerUnavailable

__all__ = ["START_TIMEOUT_S", "ServerProcess"]

START_TIMEOUT_S = 90.0
"""How long a server process may take to listen: a 2-core machine under a load of 15–20 (parallel
test runs) took 40 s to start one broker (a cluster demo, 2026-11-26)."""

_POLL_S = 0.02


class ServerProcess:
    """One ``python -m txmq <args> --host H --port P --port-file F`` subprocess; ``addr`` is
    ``<host>:<port>`` and the port survives restarts (port 0 picks a free one at the first start).

    Args:
        what: how errors name it ("broker", "name server").
        log_path: where its stderr goes (appended).
        port: the port to listen on; 0 for a free one.
        env: the whole environment of the process; None inherits this one's.
        host: the address it listens on, and so advertises (a broker registers
            ``<host>:<port>``, as RocketMQ's ``brokerIP1``).
        netns: a network namespace to run it in (``ip netns exec``; a test host of
            :class:`txmq.testing.Hosts`, whose address ``host`` then is); None: this one.
    """

    def __init__(self, what: str, log_path: Path, port: int = 0,
                 env: dict[str, str] | None = None, host: str = "127.0.0.1",
                 netns: str | None = None) -> None:
        self.what, self.log_path, self.port, self.env = what, log_path, port, env
        self.host, self.netns = host, netns
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def _launch(self, args: list[str], port_file: Path) -> None:
        """Run ``python -m txmq *args --host H --port P --port-file port_file`` (in the namespace
        ``netns`` if set; ``--host`` unless ``args`` name one) and wait until it listens.

        Raises:
            BrokerUnavailable: it exited, or did not listen within ``START_TIMEOUT_S``.
        """
        port_file.unlink(missing_ok=True)
        host = [] if "--host" in args else ["--host", self.host]
        cmd = [*(["ip", "netns", "exec", self.netns] if self.netns else []), sys.executable, "-m",
               "txmq", *args, *host, "--port", str(self.port), "--port-file", str(port_file)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                                         start_new_session=True, env=self.env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()  # a late start must not hold the port against the next attempt
                raise BrokerUnavailable(f"{self.what} did not start; see {self.log_path}")
            time.sleep(_POLL_S)
        self.port = int(port_file.read_text())

    def kill(self) -> None:
        """SIGKILL the process (a crash) and wait for it to die."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (clean shutdown), SIGKILL if it does not exit within ``timeout_s``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
