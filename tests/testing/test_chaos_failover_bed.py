"""The failover bed (issue 26): ``txmq chaos --cluster`` refuses clearly when this txmq has no
controller, the bed's executor carries out each nemesis step on real hosts (partitions in the
namespaces' routes, SIGKILL / SIGSTOP / SIGCONT / start of the host's process, the broker clock
file), and CI's short failover run (every fault kind, >= 10 faults) leaves no violation. Needs
root for the hosts; ``TXMQ_REQUIRE_NETNS=1`` (CI) makes the skip a failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from txmq.cli import app
from txmq.testing import Hosts, netns_unavailable, wait_until
from txmq.testing.chaos import ClusterSpec, FailoverBed, Step, _failover_run

_WHY = netns_unavailable()
if _WHY and os.environ.get("TXMQ_REQUIRE_NETNS") == "1":
    raise RuntimeError(f"TXMQ_REQUIRE_NETNS=1 but {_WHY}")


def test_chaos_cluster_refuses_clearly_without_a_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_failover_run, "controller_unavailable",
                        lambda: "this txmq has no controller (`txmq controller`)")
    monkeypatch.setattr(_failover_run, "netns_unavailable", lambda: "")
    res = CliRunner().invoke(app, ["chaos", "--cluster", "--faults", "1"])
    assert res.exit_code == 2
    assert "cannot run here" in res.output and "no controller" in res.output


class _Sleeper:
    """A stand-in server process: ``sleep`` in a host."""

    def __init__(self, hosts: Hosts, host: str) -> None:
        self.hosts, self.host = hosts, host
        self.proc: Any = None
        self.starts = 0

    def start(self) -> None:
        self.proc = self.hosts.popen(self.host, ["sleep", "300"])
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.kill()


def _state(p: _Sleeper) -> str:
    return Path(f"/proc/{p.proc.pid}/stat").read_text().split(")")[1].split()[0]


@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_the_bed_carries_out_each_nemesis_step(tmp_path: Path) -> None:
    bed = FailoverBed(tmp_path, ClusterSpec(groups=1, clients=1), {})
    with Hosts(bed.topo.hosts()) as hosts, bed:
        bed.hosts = hosts
        m = "broker-a-1"
        sleeper = _Sleeper(hosts, m)
        bed.procs[m] = sleeper
        sleeper.start()
        bed.apply(Step("stop", [m]))
        wait_until(lambda: _state(sleeper) == "T", timeout_s=5)
        bed.apply(Step("cont", [m]))
        wait_until(lambda: _state(sleeper) in ("S", "R"), timeout_s=5)
        bed.apply(Step("kill", [m]))
        assert sleeper.proc.poll() is not None
        bed.apply(Step("start", [m]))
        assert sleeper.starts == 2 and sleeper.proc.poll() is None
        bed.apply(Step("partition", [m], bed.topo.controllers))
        routes = subprocess.run(["ip", "-n", hosts.netns(m), "route"], capture_output=True,
                                text=True, check=True).stdout
        assert all(f"{hosts.addr(c)} dev sink0" in routes for c in bed.topo.controllers), routes
        bed.apply(Step("heal"))
        routes = subprocess.run(["ip", "-n", hosts.netns(m), "route"], capture_output=True,
                                text=True, check=True).stdout
        assert "sink0" not in routes
        bed.clock_file(m).parent.mkdir(parents=True, exist_ok=True)
        bed.apply(Step("clock", [m], amount_ms=-5000))
        assert bed.clock_file(m).read_text() == "-5000"
        assert bed.addr_of(m) == f"{hosts.addr(m)}:10911"
        assert bed.controller_addr.count(":9878") == 3
        bed.hosts = None  # Hosts' own context removes the hosts


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_a_short_failover_schedule_leaves_no_violation(tmp_path: Path) -> None:
    """CI's failover run (issue 26: >= 10 faults): every fault kind once and then some, over a
    cluster of 3 controllers and 2 groups of 2 brokers; no violation, and every killed master's
    group failed over (or its restarted master took the role back first) and wrote again."""
    from txmq.testing.chaos import FailoverConfig, render_failover_markdown, run_failover_chaos

    res = run_failover_chaos(tmp_path / "run", FailoverConfig(seed=26, faults=11, duration_s=110))
    report = render_failover_markdown(res)
    (tmp_path / "report.md").write_text(report)
    assert res.violations == [], report
    assert sum(1 for f in res.schedule if f.started_ms) >= 10, report
    s = res.failover_summary
    # every kill either failed over or its restarted master took the role back, and writes came
    # back either way
    assert s["kills"] and s["failed_over"] + s["reinstated"] == s["kills"], report
    assert all(t.restored_ms is not None for t in res.failover), report
    assert res.operations.get("send ok", 0) > 50, report


def test_the_controller_leader_is_what_a_controller_answers_to_get_metadata_info() -> None:
    import socket
    import threading

    from txmq.protocol import FLAG_RESPONSE, Command, FrameDecoder, encode_command
    from txmq.testing.chaos._bed import CONTROLLER_GET_METADATA_INFO, controller_leader

    srv = socket.create_server(("127.0.0.1", 0))
    asked: list[int] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            (req,) = FrameDecoder().feed(conn.recv(65536))
            asked.append(req.code)
            conn.sendall(encode_command(Command(0, req.opaque, FLAG_RESPONSE, ext={
                "controllerLeaderAddress": "10.200.0.2:9878", "isLeader": "false"})))

    t = threading.Thread(target=serve)
    t.start()
    dead = socket.create_server(("127.0.0.1", 0))
    dead_addr = f"127.0.0.1:{dead.getsockname()[1]}"
    dead.close()  # nothing listens there: skipped
    assert controller_leader([dead_addr, f"127.0.0.1:{srv.getsockname()[1]}"]) == "10.200.0.2:9878"
    t.join()
    srv.close()
    assert asked == [CONTROLLER_GET_METADATA_INFO]
    assert controller_leader([dead_addr]) == ""


def test_hosts_refuse_clearly_without_root_or_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from txmq.errors import NetnsUnavailable

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetnsUnavailable, match="need root"):
        Hosts(["a"])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "`ip`" in netns_unavailable()
    with pytest.raises(NetnsUnavailable, match="ip"):
        Hosts(["a"])
