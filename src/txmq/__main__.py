"""``python -m txmq`` runs the ``txmq`` command."""

from txmq.cli import main

main()
