"""Every request the broker serves is decided by the ACL table: authorized against a resource, or
explicitly public. The codes are the broker's own dispatch table and the gRPC service's descriptor,
not a copied list: adding a request code or an rpc without deciding it fails here."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from txmq.broker import Broker, BrokerConfig
from txmq.broker.acl import (
    GRPC_RULES,
    REMOTING_RULES,
    Accounts,
    AclGuard,
    RuleKind,
    Scope,
    User,
    rules_markdown,
)
from txmq.broker.grpc.pb import service_pb2
from txmq.protocol import Command, sign_remoting
from txmq.store import MemoryStore

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
_BROKER = Broker(BrokerConfig().validate(), MemoryStore(), 0)
DISPATCHED = sorted(_BROKER.request_codes())
RPCS = sorted(service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name)


def test_every_dispatched_request_code_is_decided() -> None:
    undecided = [c for c in DISPATCHED if c not in REMOTING_RULES]
    assert not undecided, f"request codes dispatched but not in the ACL table: {undecided}"
    stale = sorted(set(REMOTING_RULES) - set(DISPATCHED))
    assert not stale, f"ACL table rows for codes the broker does not dispatch: {stale}"


def test_every_rpc_is_decided() -> None:
    assert sorted(GRPC_RULES) == RPCS


@given(st.sampled_from(DISPATCHED))
def test_every_code_is_public_or_checked(code: int) -> None:
    rule = REMOTING_RULES[code]
    assert rule.kind in (RuleKind.PUBLIC, RuleKind.AUTHENTICATED, RuleKind.RESOURCE)
    assert (rule.needs is not None) == (rule.kind == RuleKind.RESOURCE)
    guard = AclGuard(Accounts({"u": User("u", "sk")}), "DefaultCluster")
    unsigned = guard.check_remoting(Command(code=code), "127.0.0.1")
    assert (unsigned is None) == (rule.kind == RuleKind.PUBLIC)


@given(st.sampled_from(DISPATCHED), st.dictionaries(st.sampled_from(["topic", "b", "consumerGroup",
                                                                     "group", "a", "x"]),
                                                    st.text(max_size=8), max_size=4),
       st.binary(max_size=40))
def test_the_check_never_raises_and_a_normal_user_without_policy_gets_nothing(
        code: int, ext: dict[str, str], body: bytes) -> None:
    guard = AclGuard(Accounts({"u": User("u", "sk")}), "DefaultCluster")
    cmd = Command(code=code, ext=sign_remoting(ext, body, "u", "sk"), body=body)
    refusal = guard.check_remoting(cmd, "127.0.0.1")
    kind = REMOTING_RULES[code].kind
    if kind == RuleKind.RESOURCE and refusal is None:  # allowed only when it needed nothing
        needs = REMOTING_RULES[code].needs
        assert needs is not None and needs(cmd, Scope("DefaultCluster")) == []
    if kind != RuleKind.RESOURCE:
        assert refusal is None


def test_the_docs_table_is_the_code_table() -> None:
    text = DOC.read_text()
    found = re.search(r"<!-- acl-table:start -->\n(.*?)<!-- acl-table:end -->", text, re.S)
    assert found, "docs/security.md lost its generated table markers"
    assert found.group(1) == rules_markdown(), "paste txmq.broker.acl.rules_markdown() between the markers"
