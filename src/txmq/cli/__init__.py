"""The ``txmq`` command."""

from txmq.cli._app import app, main

__all__ = ["app", "main"]
