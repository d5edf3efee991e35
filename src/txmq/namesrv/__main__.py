"""``python -m txmq.namesrv``: the same command as ``txmq namesrv``."""

import typer

from txmq.namesrv._main import namesrv

typer.run(namesrv)
