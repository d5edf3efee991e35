"""CPU time of another process, for the benchmarks that charge work to the broker (Linux ``/proc``)."""

from __future__ import annotations

import os

__all__ = ["process_cpu_s"]


def process_cpu_s(pid: int, *, children: bool = False) -> float:
    """CPU seconds (user + system, clock-tick resolution: 10 ms here) process ``pid`` has used,
    every thread included, ended ones too (``/proc/<pid>/stat`` utime and stime); with
    ``children``, also its children that ended and were waited for (cutime, cstime). 0.0 when the
    process is gone or there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")
