"""``txmq bench``: the benchmark commands' sub-app.

Each benchmark module defines its command; :func:`txmq.cli._app.register_commands` adds them to
:data:`bench_app` and it to the ``txmq`` app. Every benchmark prints a table and, with ``--json PATH``,
writes its figures as JSON.
"""

from __future__ import annotations

import typer

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks: each prints a table and writes JSON with --json PATH.",
                        no_args_is_help=True)
