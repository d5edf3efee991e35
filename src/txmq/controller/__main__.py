"""``python -m txmq.controller``: the same command as ``txmq controller``."""

import typer

from txmq.controller._main import controller

typer.run(controller)
