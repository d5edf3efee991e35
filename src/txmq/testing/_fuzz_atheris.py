"""Child process of ``txmq fuzz`` with atheris (:data:`CHILD_CODE`, run as ``python -c CHILD_CODE
TARGET RUNS SEED STATS_JSON CORPUS WORKDIR [libFuzzer flags]``: it imports txmq under atheris'
import hook, so only txmq's own bytecode is instrumented). libFuzzer calls ``exit`` when done, so the
counts are written to ``STATS_JSON`` as it goes (every 1000 inputs, on a finding, and at the end)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["CHILD_CODE", "INSTRUMENT_EXCLUDE", "main"]

INSTRUMENT_EXCLUDE = ["txmq.protocol._route"]
"""Modules left uninstrumented: atheris 2.3's bytecode instrumentation on CPython 3.11 breaks a
``while`` loop nested in a ``while True`` whose condition compares a subscript (``_route._string_end``
then raises ``'int' object has no attribute 'find'``, a false finding); they still run, without
coverage feedback."""

CHILD_CODE = f"""
import sys, atheris
with atheris.instrument_imports(include=["txmq"], exclude={INSTRUMENT_EXCLUDE!r}):
    from txmq.testing._fuzz_atheris import main
main(sys.argv[1:])
"""


def main(argv: list[str]) -> None:
    import atheris

    from txmq.testing._fuzz import Recorder, quiet_logs
    from txmq.testing._fuzz_targets import TARGETS

    name, runs, seed, stats_path, corpus, work, *flags = argv
    target = TARGETS[name]
    rec = Recorder(target, Path(corpus) if corpus else None)
    stats = Path(stats_path)
    budget = int(runs)

    def save() -> None:
        stats.write_text(json.dumps({"inputs": rec.inputs, "findings": sorted(rec.signatures.values())}))

    def one(data: bytes) -> None:
        found = len(rec.signatures)
        rec(data)
        if rec.inputs % 1000 == 0 or rec.inputs >= budget or len(rec.signatures) != found:
            save()

    atheris.Setup([sys.argv[0], f"-runs={budget}", f"-seed={int(seed) + 1}", "-max_len=4096",
                   "-print_final_stats=0", *flags, work], one)
    with quiet_logs():
        atheris.Fuzz()
    save()
