"""``txmq fuzz``: run the fuzz targets of :mod:`txmq.testing.fuzz` for a budget of inputs each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table

__all__ = ["fuzz"]

_DEFAULT_CORPUS = Path("tests/fuzz_corpus")


def fuzz(
    target: Annotated[list[str], typer.Option(help="Target name (repeatable), or 'all'.")],
    budget: Annotated[int, typer.Option(help="Inputs per target.", min=1)] = 10_000,
    seed: Annotated[int, typer.Option(help="Random seed (libFuzzer -seed is seed + 1).")] = 0,
    corpus: Annotated[Path, typer.Option(help="Corpus root: <corpus>/<target>/ holds seed "
                                               "inputs and the inputs that found bugs.")] = _DEFAULT_CORPUS,
    engine: Annotated[str, typer.Option(help="atheris, random, or auto (atheris if installed).")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Fuzz decoders and the broker; exit 1 if any target found something it does not expect.

    Targets: frame, header, record, message-ext, msg-trace, ha, broker. Each finding's input is saved in the
    corpus and its traceback printed on stderr.
    """
    from txmq.testing.fuzz import TARGETS, run_target

    names = list(TARGETS) if "all" in target else target
    unknown = [n for n in names if n not in TARGETS]
    if unknown or engine not in ("auto", "atheris", "random"):
        raise typer.BadParameter(f"unknown target {unknown} or engine {engine!r}; "
                                 f"targets: {', '.join(TARGETS)}")
    results = [run_target(n, budget, seed=seed, corpus=corpus, engine=engine) for n in names]
    if as_json:
        print(json.dumps([{**msgspec.to_builtins(r), "inputs_per_s": round(r.rate, 1)}
                          for r in results]))
    else:
        table = Table("target", "engine", "inputs", "findings", "inputs/s", "finding files")
        for r in results:
            table.add_row(r.target, r.engine, f"{r.inputs:,}", str(r.findings), f"{r.rate:,.0f}",
                          " ".join(r.finding_files))
        Console().print(table)
    if any(r.findings for r in results):
        raise typer.Exit(1)
