"""``txmq bench``: the benchmark commands' sub-app.

Each benchmark module adds its command to :data:`bench_app` (``@bench_app.command("name")``) and is
imported in :func:`txmq.cli._app.main`. Every benchmark prints a table and, with ``--json PATH``,
writes its figures as JSON.
"""

from __future__ import annotations

import typer

from txmq.cli._app import app

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks: each prints a table and writes JSON with --json PATH.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")
