"""The ``txmq`` command. ``app`` has every command registered; ``main()`` (``python -m txmq``)
registers only the one it runs."""

from __future__ import annotations

from txmq.extras import require_extra as _require_extra

_require_extra("broker", "the txmq command", "typer", "rich")

import typer

from txmq.cli._app import main, register_commands

__all__ = ["app", "main"]


def __getattr__(name: str) -> typer.Typer:
    """``txmq.cli.app``: the Typer app with every command registered (on first access)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from txmq.cli._app import app

    register_commands()
    return app
