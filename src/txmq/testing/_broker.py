"""Run a real ``txmq broker`` process on a free loopback port with a temporary data directory."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from txmq.testing._process import ServerProcess

__all__ = ["BrokerProcess", "run_broker"]

def _toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(x)}' for k, x in v.items()) + " }"
    return msgspec.json.encode(v).decode()


class BrokerProcess(ServerProcess):
    """A broker subprocess. ``endpoints`` is ``<host>:<port>``; the port survives restarts.

    Args:
        data_dir: the broker's data directory (kept across :meth:`kill` / :meth:`start`).
        config: extra BrokerConfig keys (e.g. ``transaction_timeout_ms=1000``); ``host`` (default
            127.0.0.1) is where it listens and the address it registers with a name server.
        log_path: where the broker's stderr goes.
        env: extra environment variables of the process (e.g. the chaos clock hook's).
        netns: a network namespace to run it in (a :class:`txmq.testing.Hosts` host's, with
            ``config["host"]`` that host's address).
    """

    def __init__(self, data_dir: Path, config: dict[str, Any] | None = None,
                 log_path: Path | None = None, env: dict[str, str] | None = None,
                 netns: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config = dict(config or {})
        super().__init__("broker", log_path or self.data_dir / "broker.log",
                         int(self.config.pop("port", 0)), {**os.environ, **env} if env else None,
                         str(self.config.pop("host", "127.0.0.1")), netns)

    @property
    def endpoints(self) -> str:
        return self.addr

    def start(self) -> None:
        """Start the process and wait until it listens. Raises BrokerUnavailable."""
        cfg = self.data_dir / "broker.toml"
        cfg.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in self.config.items()))
        self._launch(["broker", "--config", str(cfg), "--data-dir", str(self.data_dir / "store")],
                     self.data_dir / "broker.port")

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def run_broker(data_dir: Path | None = None, **config: Any) -> Iterator[BrokerProcess]:
    """Context manager: a started :class:`BrokerProcess`, stopped on exit.

    Keyword arguments are BrokerConfig keys; ``topics={"orders": 4}`` creates topics at start.
    """
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txmq-")))
        bp = BrokerProcess(data_dir, config)
        bp.start()
        stack.callback(bp.stop)
        yield bp
