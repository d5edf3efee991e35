"""ACL 2.0 policy matching and the accounts file format (``txmq.broker.acl``), with Hypothesis."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.broker.acl import (
    Accounts,
    Action,
    Decision,
    Need,
    PolicyEntry,
    Resource,
    ResourceType,
    User,
    UserType,
    parse_accounts,
    render_accounts,
)
from txmq.errors import ConfigError

names = st.text(st.sampled_from("abcxyz-_%01"), min_size=1, max_size=8)
kinds = st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER])
concrete = st.builds(Resource, kinds, names)
actions = st.lists(st.sampled_from(list(Action)), min_size=1, max_size=4, unique=True).map(tuple)
ips = st.ip_addresses(v=4).map(str)


@st.composite
def patterns(draw: st.DrawFn) -> Resource:
    which = draw(st.sampled_from(["any", "type-any", "prefix", "literal"]))
    if which == "any":
        return Resource(ResourceType.ANY)
    kind, name = draw(kinds), draw(names)
    return Resource(kind, {"type-any": "*", "prefix": name + "*", "literal": name}[which])


entries = st.builds(PolicyEntry, patterns(), actions, st.sampled_from(list(Decision)),
                    st.lists(st.sampled_from(["10.0.0.0/8", "192.0.2.7", "0.0.0.0/0"]),
                             max_size=2, unique=True).map(tuple))


def _user(*policy: PolicyEntry, kind: UserType = UserType.NORMAL) -> User:
    return User("u", "sk", kind, tuple(policy))


@given(patterns(), concrete)
def test_a_pattern_matches_by_type_and_name(p: Resource, r: Resource) -> None:
    if p.type is ResourceType.ANY:
        expected = True
    elif p.type is not r.type:
        expected = False
    elif p.name.endswith("*"):
        expected = r.name.startswith(p.name[:-1])
    else:
        expected = p.name == r.name
    assert p.matches(r) is expected


@given(st.lists(entries, max_size=6), concrete, actions, ips)
def test_deny_wins_and_nothing_is_allowed_by_default(policy: list[PolicyEntry], r: Resource,
                                                     acts: tuple[Action, ...], ip: str) -> None:
    need = Need(r, acts)
    covering = [e for e in policy if e.covers(need, ip)]
    why = Accounts().decide(_user(*policy), [need], ip)
    if any(e.decision is Decision.DENY for e in covering):
        assert why is not None and "denied" in why
    elif covering:
        assert why is None
    else:
        assert why is not None and "no policy" in why


@given(st.lists(entries, max_size=4), concrete, actions, ips)
def test_a_super_user_may_do_everything(policy: list[PolicyEntry], r: Resource,
                                        acts: tuple[Action, ...], ip: str) -> None:
    assert Accounts().decide(_user(*policy, kind=UserType.SUPER), [Need(r, acts)], ip) is None


@given(concrete, actions, ips)
def test_every_need_must_be_allowed(r: Resource, acts: tuple[Action, ...], ip: str) -> None:
    allow = PolicyEntry(r, acts)
    other = Resource(r.type, r.name + "-other")
    assert Accounts().decide(_user(allow), [Need(r, acts)], ip) is None
    assert Accounts().decide(_user(allow), [Need(r, acts), Need(other, acts)], ip) is not None


@given(concrete, st.sampled_from([a for a in Action if a is not Action.ALL]), ips)
def test_all_covers_every_action(r: Resource, act: Action, ip: str) -> None:
    assert PolicyEntry(r, (Action.ALL,)).covers(Need(r, (act,)), ip)
    assert not PolicyEntry(r, (act,)).covers(Need(r, (Action.ALL,)), ip) or act is Action.ALL


@given(ips, st.sampled_from(["10.0.0.0/8", "192.0.2.0/24", "192.0.2.7", "0.0.0.0/0"]))
def test_source_ips_are_addresses_or_ranges(ip: str, net: str) -> None:
    r = Resource(ResourceType.TOPIC, "t")
    entry = PolicyEntry(r, (Action.PUB,), source_ips=(net,))
    inside = ipaddress.ip_address(ip) in ipaddress.ip_network(net)
    assert entry.covers(Need(r, (Action.PUB,)), ip) is inside


def test_a_retry_topic_is_its_group() -> None:
    assert Resource.topic("%RETRY%ledger") == Resource(ResourceType.GROUP, "ledger")
    assert Resource.group("%RETRY%ledger") == Resource(ResourceType.GROUP, "ledger")


@pytest.mark.parametrize("text", ["Topic", "Topic:", "Queue:x", "Topic:a*b", "*:x"])
def test_bad_resources_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        Resource.parse(text)


@given(st.dictionaries(names, st.tuples(st.text(min_size=1, max_size=12), st.sampled_from(list(UserType)),
                                        st.lists(entries, max_size=3)), max_size=4))
def test_the_accounts_file_round_trips(users: dict[str, tuple[str, UserType, list[PolicyEntry]]]) -> None:
    accounts = Accounts({n: User(n, sk, t, tuple(p)) for n, (sk, t, p) in users.items()})
    assert parse_accounts(render_accounts(accounts)) == accounts


@pytest.mark.parametrize("text", [
    "users = 1",
    "[users.a]\ntype = 'Normal'",
    "[users.a]\nsecret_key = 'x'\nlevel = 3",
    "[users.a]\nsecret_key = 'x'\npolicy = [{ resource = 'Topic:t', actions = ['Publish'] }]",
    "[users.a]\nsecret_key = 'x'\npolicy = [{ resource = 'Topic:t', actions = [] }]",
    "[users.a]\nsecret_key = 'x'\npolicy = [{ resource = 'Topic:t', actions = ['Pub'], source_ips = ['x'] }]",
    "[other]\n",
    "not toml [",
])
def test_bad_files_say_why(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_accounts(text)
