"""Test hosts with their own addresses: Linux network namespaces on one bridge, and network faults
between them (a Jepsen-style test bed; issue 26).

Layout (``x`` is a free second octet, ``i`` the host's index from 1)::

    root namespace                      host namespace "txq-<pid><tag>-<name>" (tag: 2 letters)
    bridge txq<pid><tag>br 10.x.0.254 --- veth txq<pid><tag>v<i> <-> eth0  10.x.0.<i>/24
                                                                    sink0 <-> sink1 (noarp)
                                                                    dly0 (TUN, while delayed)

Faults, all healed by :meth:`Hosts.heal`:

- ``partition(a, b)``: each host of ``a`` routes every address of ``b`` into its ``sink0`` veth
  (a silent drop: the packets leave and nobody takes them, as a cut cable), and each of ``b``
  routes ``a``'s the same way; hosts outside both sets are not touched. ``isolate(h)`` cuts ``h``
  from every other host and the root namespace.
- ``delay(h, ms)`` / ``loss(h, pct)``: ``h``'s outgoing subnet traffic goes through a TUN device
  and a userspace delay line (:mod:`txmq.testing._tundelay`), since ``netem`` is not in every
  kernel (Firecracker guests lack ``CONFIG_NET_SCH_NETEM``).

Names carry this process's pid, so parallel runs never collide, and a new :class:`Hosts` first
removes the namespaces and bridges of dead processes (a crashed run's leftovers); a closed bed's
veths may outlive :meth:`Hosts.close` for up to a minute, while the kernel keeps the namespace for
its TIME_WAIT sockets, under names no later bed takes. Needs root and
iproute2's ``ip``; :func:`netns_unavailable` says why not.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import select
import shutil
import string
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from txmq.errors import NetnsUnavailable

__all__ = ["HOSTS_MAX", "ROOT", "Hosts", "netns_unavailable"]

PREFIX = "txq"
"""Every namespace (``txq-…``), bridge and veth (``txq…``) of the test bed starts with this."""
SUBNET_OCTETS = range(200, 250)
"""Second octets tried for the bed's ``10.x.0.0/24`` (txmq: high, away from common 10.0–10.20)."""
HOSTS_MAX = 99
"""Hosts in one bed (addresses .1 … .99; .254 is the bridge): a veth name ``txq<pid><tag>v<i>``
must fit Linux's 15 characters (IFNAMSIZ 16) with a 7-digit pid."""
BRIDGE_HOST = 254
ROOT = "root"
"""The root namespace as a host name for :meth:`Hosts.partition` (address: the bridge's)."""
DELAY_READY_TIMEOUT_S = 30.0
"""How long a delay line may take to create its TUN device (a Python start on a loaded machine)."""
_DELAY_TABLE = "100"
_LOCK = Path("/run/txmq-netns.lock")
_NS_RE = re.compile(rf"^{PREFIX}-(\d+)[a-z]{{2}}-")
_LINK_RE = re.compile(rf"^{PREFIX}(\d+)[a-z]{{2}}(br|s0)$")
_tags = itertools.count()


def netns_unavailable() -> str:
    """Why network namespaces cannot be made here ("" when they can): not root, no ``ip``."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if not Path("/dev/net/tun").exists():
        return "/dev/net/tun is missing (the delay line needs TUN)"
    return ""


def _ip(*args: str, check: bool = True) -> str:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and res.returncode:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}")
    return res.stdout


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale() -> list[str]:
    """Delete the namespaces and bridges of this test bed whose process is dead; returns their
    names."""
    gone = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if (m := _NS_RE.match(name)) and not _alive(int(m.group(1))):
            _ip("netns", "del", name, check=False)
            gone.append(name)
    for line in _ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if (m := _LINK_RE.match(name)) and not _alive(int(m.group(1))):
            _ip("link", "del", name, check=False)
            gone.append(name)
    return gone


def _free_octet() -> int:
    used = _ip("-o", "-4", "addr", "show") + _ip("-4", "route", "show")
    for x in SUBNET_OCTETS:
        if f" 10.{x}." not in used and f"\n10.{x}." not in "\n" + used:
            return x
    raise NetnsUnavailable(f"no free 10.x.0.0/24 subnet for x in {SUBNET_OCTETS}")


class Hosts:
    """Hosts ``names`` (each a network namespace with one address) on a bridge the root namespace
    is on too, so processes here reach every host. Use as a context manager, or call
    :meth:`close` (it always removes everything).

    Args:
        names: host names (distinct, not ``root``), at most :data:`HOSTS_MAX`.

    Raises:
        NetnsUnavailable: not root, no ``ip``, or a command failed (what was made is removed).
        ValueError: bad names.
    """

    def __init__(self, names: Sequence[str]) -> None:
        if why := netns_unavailable():
            raise NetnsUnavailable(why)
        if len(set(names)) != len(names) or ROOT in names or not 0 < len(names) <= HOSTS_MAX:
            raise ValueError(f"host names must be 1..{HOSTS_MAX} distinct names, not {ROOT!r}")
        k = next(_tags) % (26 * 26)  # two letters: a closed bed's veths may linger a minute
        tag = string.ascii_lowercase[k // 26] + string.ascii_lowercase[k % 26]
        self.stem = f"{PREFIX}{os.getpid()}{tag}"
        self.names = list(names)
        self.bridge = f"{self.stem}br"
        self._ns = {n: f"{PREFIX}-{os.getpid()}{tag}-{n}" for n in names}
        self._cuts: set[tuple[str, str]] = set()  # (host, address routed to the sink)
        self._delays: dict[str, subprocess.Popen[bytes]] = {}
        self._made: list[str] = []
        try:
            with self._locked():
                remove_stale()
                self.octet = _free_octet()
                self._make_bridge()
            for i, n in enumerate(self.names, 1):
                self._make_host(n, i)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(_LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _make_bridge(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(self.bridge)
        _ip("addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        # the root namespace's own sink, for partitions from ROOT
        _ip("link", "add", f"{self.stem}s0", "type", "veth", "peer", "name", f"{self.stem}s1")
        self._made.append(f"{self.stem}s0")
        for s in ("s0", "s1"):
            _ip("link", "set", f"{self.stem}{s}", "arp", "off", "up")

    def _make_host(self, name: str, i: int) -> None:
        ns, veth = self._ns[name], f"{self.stem}v{i}"
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "add", "sink0", "type", "veth", "peer", "name", "sink1")
        for dev in ("lo", "eth0", "sink0", "sink1"):
            _ip("-n", ns, "link", "set", dev, *(("arp", "off") if "sink" in dev else ()), "up")

    @property
    def bridge_addr(self) -> str:
        """The root namespace's address on the bridge, ``10.x.0.254``."""
        return f"10.{self.octet}.0.{BRIDGE_HOST}"

    def addr(self, name: str) -> str:
        """Host ``name``'s IPv4 address (``root``: the bridge's). Raises KeyError."""
        if name == ROOT:
            return self.bridge_addr
        return f"10.{self.octet}.0.{self.names.index(name) + 1}" if name in self._ns else \
            self._unknown(name)

    def _unknown(self, name: str) -> str:
        raise KeyError(f"no host {name!r}; hosts: {self.names}")

    def netns(self, name: str) -> str:
        """The namespace name of host ``name`` (for ``ip netns exec``). Raises KeyError."""
        return self._ns[name] if name in self._ns else self._unknown(name)

    def prefix(self, name: str) -> list[str]:
        """The argv prefix that runs a command in host ``name``: ``ip netns exec <ns>``."""
        return ["ip", "netns", "exec", self.netns(name)]

    def run(self, name: str, cmd: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run(cmd)`` inside host ``name`` (keyword arguments pass through)."""
        return subprocess.run([*self.prefix(name), *cmd], check=kw.pop("check", False), **kw)

    def popen(self, name: str, cmd: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(cmd)`` inside host ``name``."""
        return subprocess.Popen([*self.prefix(name), *cmd], **kw)

    def _ns_args(self, name: str) -> list[str]:
        return [] if name == ROOT else ["-n", self.netns(name)]

    def _sink(self, name: str) -> str:
        return f"{self.stem}s0" if name == ROOT else "sink0"

    def _cut(self, host: str, peer: str) -> None:
        dst = self.addr(peer)
        if (host, dst) not in self._cuts:
            _ip(*self._ns_args(host), "route", "replace", f"{dst}/32", "dev", self._sink(host))
            self._cuts.add((host, dst))

    def partition(self, a: Iterable[str], b: Iterable[str]) -> None:
        """Cut all traffic between every host of ``a`` and every host of ``b``, both ways
        (``root`` names the root namespace). Raises KeyError, ValueError (overlapping sets)."""
        sa, sb = set(a), set(b)
        if sa & sb:
            raise ValueError(f"a host cannot be on both sides: {sorted(sa & sb)}")
        for x, y in itertools.product(sa, sb):
            self._cut(x, y)
            self._cut(y, x)

    def isolate(self, name: str) -> None:
        """Cut host ``name`` from every other host and from the root namespace."""
        self.partition([name], [n for n in [*self.names, ROOT] if n != name])

    def delay(self, name: str, ms: int) -> None:
        """Delay every packet host ``name`` sends to the bed's subnet by ``ms``."""
        self._delay_line(name, ms, 0.0)

    def loss(self, name: str, pct: float) -> None:
        """Drop ``pct`` % (at random) of the packets host ``name`` sends to the bed's subnet."""
        self._delay_line(name, 0, pct)

    def _delay_line(self, name: str, ms: int, pct: float) -> None:
        self._undelay(name)
        ns, addr = self.netns(name), self.addr(name)
        script = Path(__file__).with_name("_tundelay.py")  # a script: no package import
        proc = subprocess.Popen([*self.prefix(name), sys.executable, str(script), "dly0", str(ms),
                                 str(pct), str(self.octet)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self._delays[name] = proc
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], DELAY_READY_TIMEOUT_S)
        if not ready or proc.stdout.readline().strip() != b"ready":
            self._undelay(name)
            raise NetnsUnavailable(f"the delay line of host {name} did not start")
        _ip("-n", ns, "link", "set", "dly0", "up")
        for key, value in (("ip_forward", "1"), ("conf/dly0/accept_local", "1"),
                           ("conf/dly0/rp_filter", "0"), ("conf/all/rp_filter", "0")):
            self.run(name, ["sh", "-c", f"echo {value} > /proc/sys/net/ipv4/{key}"], check=True)
        _ip("-n", ns, "route", "replace", f"10.{self.octet}.0.0/24", "dev", "dly0", "src", addr,
            "table", _DELAY_TABLE)
        _ip("-n", ns, "rule", "add", "pref", "100", "iif", "dly0", "lookup", "main")
        _ip("-n", ns, "rule", "add", "pref", "101", "lookup", _DELAY_TABLE)

    def _undelay(self, name: str) -> None:
        proc = self._delays.pop(name, None)
        if proc is None:
            return
        ns = self.netns(name)
        for pref in ("101", "100"):
            _ip("-n", ns, "rule", "del", "pref", pref, check=False)
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def heal(self) -> None:
        """Undo every partition, delay and loss."""
        for host, dst in sorted(self._cuts):
            _ip(*self._ns_args(host), "route", "del", f"{dst}/32", "dev", self._sink(host),
                check=False)
        self._cuts.clear()
        for name in list(self._delays):
            self._undelay(name)

    def close(self) -> None:
        """Heal, then delete every namespace, veth and the bridge (idempotent)."""
        self.heal()
        for made in reversed(self._made):
            if made.startswith(f"{PREFIX}-"):
                _ip("netns", "del", made, check=False)
            else:
                _ip("link", "del", made, check=False)
        self._made.clear()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
