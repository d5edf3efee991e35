"""Sync and asyncio clients are one client (#23 item 5, defect 9): every public method of an async
client exists on its sync twin with the same typed signature (less ``async``), and vice versa,
constructors included, so a method added to one side only fails CI."""

from __future__ import annotations

import inspect

import pytest

from txmq.client import (
    Admin,
    AsyncAdmin,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)

PAIRS = [(Producer, AsyncProducer), (TransactionProducer, AsyncTransactionProducer),
         (PushConsumer, AsyncPushConsumer), (PullConsumer, AsyncPullConsumer),
         (Admin, AsyncAdmin)]

ASYNC_ONLY = {"connection"}
"""Returns an AsyncConnection bound to the client's event loop: no sync meaning."""
SYNC_ONLY = {"loop_errors"}
"""A method on the sync side (it reads the loop thread's counter there), a Counter attribute on the
async side."""


def methods(cls: type) -> dict[str, object]:
    return {n: inspect.getattr_static(cls, n) for n in dir(cls)
            if (not n.startswith("_") or n == "__init__")
            and inspect.isfunction(inspect.getattr_static(cls, n))}


@pytest.mark.parametrize(("sync", "asyn"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_same_public_methods_with_the_same_signatures(sync: type, asyn: type) -> None:
    s, a = methods(sync), methods(asyn)
    assert sorted(set(a) - set(s) - ASYNC_ONLY) == [], "async methods without a sync twin"
    assert sorted(set(s) - set(a) - SYNC_ONLY) == [], "sync methods without an async twin"
    diffs = {}
    for name in sorted(set(s) & set(a)):
        ss, sa = inspect.signature(s[name]), inspect.signature(a[name])  # type: ignore[arg-type]
        if ss != sa:
            diffs[name] = (str(ss), str(sa))
    assert diffs == {}


@pytest.mark.parametrize(("sync", "asyn"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_sync_constructors_show_their_parameters(sync: type, asyn: type) -> None:
    params = inspect.signature(sync.__init__).parameters.values()
    assert all(p.kind is not p.VAR_KEYWORD for p in params)
    assert len(params) == len(inspect.signature(asyn.__init__).parameters) > 2
