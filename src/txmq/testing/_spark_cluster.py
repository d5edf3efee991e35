"""A Spark standalone cluster on loopback: one master and N workers, each a separate JVM started with
PySpark's ``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` / ``…worker.Worker``).

Applications connect with ``spark_session(app, master=cluster.master_url)``; the master then starts
one executor JVM (``CoarseGrainedExecutorBackend``) per worker as a child of that worker, and each
executor runs its Python workers with this environment's interpreter (``PYSPARK_PYTHON`` is set in
the workers' environment). Each daemon leads its own process group (its executors inherit it) and
:meth:`SparkCluster.stop` also kills the descendants outside it, so it leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from txmq import limits
from txmq.errors import TxmqError
from txmq.testing._ports import free_port

__all__ = ["FAST_START_JAVA_OPTIONS", "SparkCluster", "SparkClusterError"]

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
"""The main class of a standalone executor JVM (Spark's ``ExecutorRunner`` launches it)."""

FAST_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM options for short-lived test JVMs: the C1 compiler only (HotSpot's C2 compiles hot code
better but spends CPU on it that a job of seconds never earns back) and the serial collector (no
parallel GC threads competing for the 2 cores). Not for benchmarks: C2 code is faster."""


class SparkClusterError(TxmqError):
    """The cluster did not start (a JVM exited, or workers did not register in time)."""

    code = "SPARK_CLUSTER_ERROR"


def spark_home() -> Path:
    """PySpark's package directory, which holds ``bin/spark-class`` and ``jars/`` (pip's PySpark
    is a complete Spark distribution); ``$SPARK_HOME`` if set."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).parent


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def _descendants(roots: set[int]) -> set[int]:
    """Every live descendant of ``roots`` (``/proc``); PySpark's ``daemon.py`` puts itself and its
    Python workers in a process group of their own, so a worker's group does not hold them all."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(_ppid(int(entry)), []).append(int(entry))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class SparkCluster:
    """A standalone master and ``workers`` workers on free loopback ports.

    Args:
        workdir: the cluster's directory: ``logs/`` (each JVM's stdout and stderr) and
            ``worker-<i>/`` (the worker's ``--work-dir``: executors' stdout/stderr per application).
        workers: how many workers (default 2: the issue's "two executors of one core each").
        cores_per_worker: cores each worker offers (default 1: one task at a time per executor).
        memory_per_worker: memory each worker offers to executors (default ``"1g"``, which fits
            one executor at Spark's default ``spark.executor.memory`` of 1g).
        daemon_memory: heap of the master and worker daemons (``SPARK_DAEMON_MEMORY``; default
            ``"256m"``: they only keep the cluster's bookkeeping; Spark's own default is 1g).
        java_options: JVM options of every JVM of the cluster: the daemons and the executors they
            start, which inherit their worker's environment (set as ``JAVA_TOOL_OPTIONS``, which
            every JVM reads). Default none; tests pass :data:`FAST_START_JAVA_OPTIONS`.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. Raises
    :class:`SparkClusterError` from :meth:`start` when a JVM exits or the workers do not register
    within :data:`txmq.limits.SPARK_CLUSTER_START_TIMEOUT_S`.
    """

    def __init__(self, workdir: Path, workers: int = 2, cores_per_worker: int = 1,
                 memory_per_worker: str = "1g", daemon_memory: str = "256m",
                 java_options: str = "") -> None:
        self.workdir = Path(workdir)
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.daemon_memory = daemon_memory
        self.java_options = java_options
        self.master_port = 0
        self.master_ui_port = 0
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: what ``spark_session(master=...)`` takes."""
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def master_ui_url(self) -> str:
        """The master's web UI; ``<url>/json`` describes the workers and applications."""
        return f"http://127.0.0.1:{self.master_ui_port}"

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_DAEMON_MEMORY": self.daemon_memory, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}
        if self.java_options:
            env["JAVA_TOOL_OPTIONS"] = self.java_options
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with open(logs / f"{name}.out", "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self._env(), cwd=self.workdir, start_new_session=True)

    def start(self) -> SparkCluster:
        """Start the master and the workers; return once every worker is ALIVE at the master."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.master_port, self.master_ui_port = free_port(), free_port()
        try:
            self._master = self._spawn("master", [
                "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)])
            for i in range(self.workers):
                work = self.workdir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._workers.append(self._spawn(f"worker-{i}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                    "--port", str(free_port()), "--webui-port", str(free_port()),
                    "--cores", str(self.cores_per_worker), "--memory", self.memory_per_worker,
                    "--work-dir", str(work), self.master_url]))
            self._wait_workers(limits.SPARK_CLUSTER_START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> dict[str, object]:
        """The master's ``/json`` document (workers, alive workers, applications).

        Raises OSError (e.g. ``URLError``) when the master's web UI does not answer.
        """
        with urllib.request.urlopen(self.master_ui_url + "/json", timeout=5) as r:
            doc: dict[str, object] = json.loads(r.read())
        return doc

    def _wait_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for name, p in [("master", self._master), *((f"worker-{i}", w)
                                                         for i, w in enumerate(self._workers))]:
                if p is not None and p.poll() is not None:
                    raise SparkClusterError(f"spark {name} exited with {p.returncode}; see "
                                            f"{self.workdir / 'logs' / (name + '.out')}")
            with contextlib.suppress(OSError, ValueError):
                if self.status().get("aliveworkers") == self.workers:
                    return
            if time.monotonic() > deadline:
                raise SparkClusterError(f"{self.workers} spark workers not registered after "
                                        f"{timeout_s:.0f} s; see {self.workdir / 'logs'}")
            time.sleep(0.25)

    def executor_pids(self) -> list[int]:
        """Process ids of the executor JVMs (``CoarseGrainedExecutorBackend``) whose parent is one
        of this cluster's workers, found in ``/proc`` (Linux)."""
        workers = {w.pid for w in self._workers if w.poll() is None}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                pid = int(entry)
                if _ppid(pid) in workers and EXECUTOR_CLASS in _cmdline(pid):
                    found.append(pid)
        return sorted(found)

    def kill_executor(self, pid: int | None = None) -> int:
        """SIGKILL one executor JVM (``pid``, or the first of :meth:`executor_pids`); returns its
        pid. Its worker reports the loss; the master starts a replacement executor.

        Raises SparkClusterError when there is no executor to kill.
        """
        if pid is None:
            pids = self.executor_pids()
            if not pids:
                raise SparkClusterError("no executor is running")
            pid = pids[0]
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every process group (workers first, then the master), SIGKILL what is left
        after ``timeout_s``, then SIGKILL any descendant seen before that is still alive.
        Executors are in their worker's group; their Python workers are in a group of their own."""
        procs = [*self._workers, *([self._master] if self._master else [])]
        descendants = _descendants({p.pid for p in procs})
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # children left in the group, or a stuck JVM
            p.wait()
        for pid in descendants:  # Python workers outside the groups, if still there
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._workers, self._master = [], None

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
