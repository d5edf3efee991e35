"""The ``txmq`` command."""

from txmq.cli._app import app, main, register_commands

register_commands()

__all__ = ["app", "main"]
