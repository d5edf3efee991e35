"""Loading the broker's metadata blobs (``meta/*.json``) so that one bad file never stops a start.

A blob that cannot be read or does not decode is quarantined by the store (moved aside under
``quarantine/``), logged with what is lost, and the broker starts with what it can rebuild.
"""

from __future__ import annotations

import logging
from typing import TypeVar

import msgspec

from txmq.errors import StoreError
from txmq.store import Store

__all__ = ["load_json_meta"]

log = logging.getLogger("txmq.broker")

T = TypeVar("T")


def load_json_meta(store: Store, name: str, kind: type[T], if_lost: str) -> T | None:
    """The JSON metadata blob ``name`` decoded as ``kind``; None if there is none, or if it cannot
    be read or decoded: then it is quarantined and logged at ERROR level with ``if_lost`` (what the
    broker does without it). Never raises."""
    try:
        raw = store.load_meta(name)
        return None if raw is None else msgspec.json.decode(raw, type=kind)
    except (StoreError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        reason = f"metadata {name} unusable: {exc}"
        where = store.quarantine_meta(name, reason)
        log.error("%s%s; %s", reason, f" (moved to {where})" if where else "", if_lost)
        return None
