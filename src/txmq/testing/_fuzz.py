"""Run fuzz targets: coverage-guided with atheris (libFuzzer) when it is installed, else a seeded
random mutation of the seed inputs and the corpus.

A finding (an exception a target does not expect) is saved under ``<corpus>/<target>/`` as
``finding-<sha1>.bin`` (one file per distinct exception type and place), printed with its traceback,
and counted. ``replay`` feeds one saved input to its target again (the test suite replays the whole
committed corpus).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from txmq.testing._fuzz_atheris import CHILD_CODE
from txmq.testing._fuzz_targets import TARGETS, Target

__all__ = ["FuzzResult", "Recorder", "atheris_available", "finding_signature", "mutate",
           "quiet_logs", "replay", "run_target"]


class FuzzResult(msgspec.Struct, kw_only=True):
    """One target's run: inputs executed, distinct findings (files saved), seconds, engine."""

    target: str
    inputs: int
    findings: int
    seconds: float
    engine: str
    finding_files: list[str] = msgspec.field(default_factory=list)

    @property
    def rate(self) -> float:
        """Inputs per second."""
        return self.inputs / self.seconds if self.seconds > 0 else 0.0


def atheris_available() -> bool:
    """Whether atheris imports (it is a dev dependency with wheels for CPython 3.11 on Linux)."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def replay(target: str, data: bytes) -> BaseException | None:
    """Run one input; return the unexpected exception it raises, or None."""
    t = TARGETS[target]
    try:
        t.run(data)
    except t.expected:
        return None
    except Exception as exc:
        return exc
    return None


def finding_signature(exc: BaseException) -> str:
    """Type and innermost txmq frame of an exception: findings with one signature are one bug."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "txmq" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    head = ""
    if type(exc).__name__ == "BrokerFinding":  # what, and the exception type behind a SYSTEM_ERROR
        what, _, rest = str(exc).partition(": ")
        named = what.endswith("SYSTEM_ERROR") or what.startswith("reopen failed")
        cause = rest.split(":")[0] if named else ""
        head = f"{what[:60]} {cause[:40]}".strip()
    return f"{type(exc).__name__}@{where}{' ' + head if head else ''}"


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Findings are printed by the :class:`Recorder`, not logged a million times: the ``txmq``
    logger stops propagating for the run, and is restored after it (a run inside a test process
    must leave logging as it found it)."""
    quiet = logging.getLogger("txmq")
    propagate, null = quiet.propagate, logging.NullHandler()
    quiet.propagate = False
    quiet.addHandler(null)
    try:
        yield
    finally:
        quiet.removeHandler(null)
        quiet.propagate = propagate


class Recorder:
    """Counts inputs and saves one input per distinct finding."""

    def __init__(self, target: Target, corpus: Path | None) -> None:
        self.target, self.corpus = target, corpus
        self.inputs = 0
        self.signatures: dict[str, str] = {}

    def __call__(self, data: bytes) -> None:
        self.inputs += 1
        exc = replay(self.target.name, data)
        if exc is None:
            return
        sig = finding_signature(exc)
        if sig in self.signatures:
            return
        name = f"finding-{hashlib.sha1(data).hexdigest()[:16]}.bin"
        self.signatures[sig] = name
        if self.corpus is not None:
            (self.corpus / self.target.name).mkdir(parents=True, exist_ok=True)
            (self.corpus / self.target.name / name).write_bytes(data)
        print(f"FINDING in {self.target.name} ({sig}), input saved as {name}:", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)


def _inputs(target: Target, corpus: Path | None) -> list[bytes]:
    seeds = list(target.seeds())
    if corpus is not None and (corpus / target.name).is_dir():
        seeds += [p.read_bytes() for p in sorted((corpus / target.name).iterdir()) if p.is_file()]
    return seeds


_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]


def mutate(rng: random.Random, data: bytes, pool: list[bytes], max_len: int = 4096) -> bytes:
    """One random mutation (libFuzzer's kinds): flip, set, insert, erase, repeat, splice, or write
    an interesting integer; the result is at most ``max_len`` bytes."""
    buf = bytearray(data)
    for _ in range(1 + rng.randrange(4)):
        kind = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:
            buf[pos % len(buf)] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:
            buf[pos % len(buf)] = rng.randrange(256)
        elif kind == 2:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(1 + rng.randrange(8)))
        elif kind == 3 and buf:
            del buf[pos : pos + 1 + rng.randrange(16)]
        elif kind == 4 and buf:
            start = rng.randrange(len(buf))
            buf[pos:pos] = buf[start : start + 1 + rng.randrange(32)] * (1 + rng.randrange(4))
        elif kind == 5:
            other = rng.choice(pool)
            cut = rng.randrange(len(other) + 1)
            buf[pos:] = other[cut:] if rng.randrange(2) else other[:cut]
        else:
            width = rng.choice([1, 2, 4, 8])
            val = rng.choice(_INTERESTING) & ((1 << (8 * width)) - 1)
            buf[pos : pos + width] = val.to_bytes(width, rng.choice(["big", "little"]))
    return bytes(buf[:max_len])


def _run_random(target: Target, budget: int, seed: int, corpus: Path | None) -> FuzzResult:
    rng = random.Random(seed)
    rec = Recorder(target, corpus)
    pool = _inputs(target, corpus) or [b""]
    start = time.perf_counter()
    with quiet_logs():
        for data in pool[:budget]:
            rec(data)
        while rec.inputs < budget:
            parent = rng.choice(pool)
            child = mutate(rng, parent, pool)
            rec(child)
            if rng.randrange(64) == 0 and len(pool) < 4096:
                pool.append(child)  # keep some mutants as parents (no coverage feedback here)
    return FuzzResult(target=target.name, inputs=rec.inputs, findings=len(rec.signatures),
                      seconds=time.perf_counter() - start, engine="random",
                      finding_files=sorted(rec.signatures.values()))


def _run_atheris(target: Target, budget: int, seed: int, corpus: Path | None) -> FuzzResult:
    """libFuzzer exits its process when done, so it runs in a child; seeds and corpus are copied
    to a scratch directory (libFuzzer adds its coverage corpus there, not to ``corpus``)."""
    with tempfile.TemporaryDirectory(prefix="txmq-fuzz-") as tmp:
        work = Path(tmp) / "corpus"
        work.mkdir()
        for data in _inputs(target, corpus):
            (work / hashlib.sha1(data).hexdigest()).write_bytes(data)
        stats = Path(tmp) / "stats.json"
        cmd = [sys.executable, "-c", CHILD_CODE, target.name, str(budget),
               str(seed), str(stats), str(corpus or ""), str(work), f"-artifact_prefix={tmp}/"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False)
        seconds = time.perf_counter() - start
        got: dict[str, Any] = (json.loads(stats.read_text()) if stats.exists()
                               else {"inputs": 0, "findings": []})
        files = list(got["findings"])
        if proc.returncode != 0:  # a crash below Python (a C extension), or the child failed
            for crash in Path(tmp).glob("crash-*"):
                data = crash.read_bytes()
                name = f"finding-{hashlib.sha1(data).hexdigest()[:16]}.bin"
                if corpus is not None:
                    (corpus / target.name).mkdir(parents=True, exist_ok=True)
                    (corpus / target.name / name).write_bytes(data)
                files.append(name)
            files = files or [f"exit-{proc.returncode}"]
    return FuzzResult(target=target.name, inputs=int(got["inputs"]), findings=len(files),
                      seconds=seconds, engine="atheris", finding_files=sorted(files))


def run_target(name: str, budget: int, *, seed: int = 0, corpus: Path | None = None,
               engine: str = "auto") -> FuzzResult:
    """Run ``budget`` inputs through target ``name``.

    Args:
        engine: ``atheris``, ``random`` or ``auto`` (atheris when available).

    Raises:
        KeyError: no such target.
    """
    target = TARGETS[name]
    if engine == "auto":
        engine = "atheris" if atheris_available() else "random"
    run = _run_atheris if engine == "atheris" else _run_random
    return run(target, budget, seed, corpus)
