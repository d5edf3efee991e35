"""Optional features and the extra that installs each (``pip install 'txmq[<extra>]'``).

The core distribution is the SDK (:mod:`txmq.client`: msgspec, isal, uvloop where it builds). The
extras, as ``pyproject.toml`` declares them: ``broker`` (broker, name server, controller and the
``txmq`` command), ``grpc`` (the broker's RocketMQ 5 gRPC door), ``outbox`` (+ ``postgresql`` /
``mysql`` drivers), ``rabbitmq`` and ``nats`` (outbox transports), ``spark``, ``console``, ``demo``,
``bench`` and ``all``. A package that needs an extra imports its dependencies inside
:func:`requires_extra`, or checks them with :func:`require_extra` when it imports them lazily, so a
missing one raises :class:`txmq.errors.MissingExtra` naming the install command.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from txmq.errors import MissingExtra

__all__ = ["MissingExtra", "require_extra", "requires_extra"]


@contextmanager
def requires_extra(extra: str, feature: str) -> Iterator[None]:
    """Turn a :class:`ModuleNotFoundError` of a third-party module raised in the block into
    :class:`MissingExtra` (``pip install 'txmq[<extra>]'``); txmq's own missing modules and an
    inner :class:`MissingExtra` pass unchanged.

    Args:
        extra: the extra that installs what the block imports, e.g. ``"spark"``.
        feature: what needs it, for the message, e.g. ``"txmq.spark"``.
    Raises:
        MissingExtra: the block imported a module that is not installed.
    """
    try:
        yield
    except MissingExtra:
        raise
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if not top or top == "txmq":
            raise
        raise MissingExtra(extra, feature, top) from exc


def require_extra(extra: str, feature: str, *modules: str) -> None:
    """Check that every top-level module in ``modules`` is installed, without importing it (for
    packages that import their dependencies on first use, as :mod:`txmq.spark` does).

    Raises:
        MissingExtra: naming the first module that is not installed.
    """
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(extra, feature, module)
