"""ACL 2.0's model, sans-IO: users, resources, actions, policy entries and the decision.

Names follow apache/rocketmq's ``auth`` module (5.3): ``User`` / ``UserType`` (Super, Normal),
``Resource`` = ``ResourceType`` + name + ``ResourcePattern`` (LITERAL ``Topic:orders``, PREFIXED
``Topic:order*``, ANY ``Topic:*``, and ``*`` for every resource), ``Action`` (Pub, Sub, Create,
Update, Delete, Get, List, All), ``Decision`` (Allow, Deny), ``PolicyEntry`` with an
``Environment`` of source IPs (addresses or CIDR ranges). txmq adds three actions of its own:
``TxAdmin`` (an operator's commit, rollback or resume of a transaction), ``ResetOffset`` and
``DlqResend``.

Deciding (:meth:`Accounts.decide`): a super user may do everything. For a normal user each
:class:`Need` of the request (a resource and the actions any one of which suffices, as
``PolicyEntry#isMatchAction`` takes a list) is looked up among the user's entries whose resource,
action and source IP match: any matching Deny refuses, else a matching Allow admits, else it is
refused (nothing is allowed by default). txmq departs from RocketMQ's ``DefaultAuthorizationHandler``
(which takes the most specific matching entry) in one way: a Deny always wins, whatever Allow is
more specific, so a deny entry can never be undone by a narrower allow.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import Enum
from typing import Self

from txmq.errors import ConfigError
from txmq.protocol import RETRY_PREFIX

__all__ = [
    "Accounts",
    "Action",
    "Decision",
    "Need",
    "PolicyEntry",
    "Resource",
    "ResourceType",
    "User",
    "UserType",
]


class _Named(Enum):
    """An enum read by its RocketMQ name, case-insensitively (``Action.getByName``)."""

    @classmethod
    def of(cls, name: str) -> Self:
        for m in cls:
            if m.value.lower() == name.strip().lower():
                return m
        choices = ", ".join(m.value for m in cls)
        raise ConfigError(f"{cls.__name__} {name!r} is not one of {choices}")


class Action(_Named):
    """What a request does to a resource (RocketMQ ``Action``, plus txmq's own three)."""

    ALL = "All"
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    TX_ADMIN = "TxAdmin"
    """txmq: an operator's commit, rollback or resume of someone's transaction."""
    RESET_OFFSET = "ResetOffset"
    """txmq: reset a consumer group's offsets."""
    DLQ_RESEND = "DlqResend"
    """txmq: put dead letters back in a group's retry topic."""


class ResourceType(_Named):
    """RocketMQ ``ResourceType`` (the kinds txmq has)."""

    ANY = "*"
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


class Decision(_Named):
    ALLOW = "Allow"
    DENY = "Deny"


class UserType(_Named):
    SUPER = "Super"
    NORMAL = "Normal"


@dataclass(frozen=True)
class Resource:
    """A resource or a pattern of them: ``*``, ``Topic:*``, ``Topic:order*``, ``Topic:orders``.

    A name ending in ``*`` is PREFIXED, a bare ``*`` ANY (RocketMQ ``ResourcePattern``).
    """

    type: ResourceType
    name: str = "*"

    @classmethod
    def parse(cls, text: str) -> Resource:
        """``Type:name`` or ``*``. Raises ConfigError."""
        text = text.strip()
        if text == "*":
            return cls(ResourceType.ANY)
        kind, sep, name = text.partition(":")
        if not sep or not name:
            raise ConfigError(f"resource {text!r} is not '*' or 'Type:name' (Topic, Group, Cluster)")
        rtype = ResourceType.of(kind)
        if rtype is ResourceType.ANY:
            raise ConfigError(f"resource {text!r}: write '*' alone for every resource")
        if "*" in name[:-1]:
            raise ConfigError(f"resource {text!r}: '*' may only end the name")
        return cls(rtype, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        """Group ``name``; a retry topic names its group (RocketMQ ``Resource.ofGroup``)."""
        return cls(ResourceType.GROUP, name.removeprefix(RETRY_PREFIX))

    @classmethod
    def topic(cls, name: str) -> Resource:
        """Topic ``name``; a retry topic ``%RETRY%g`` is group ``g`` (as RocketMQ maps it)."""
        if name.startswith(RETRY_PREFIX):
            return cls.group(name)
        return cls(ResourceType.TOPIC, name)

    def __str__(self) -> str:
        return "*" if self.type is ResourceType.ANY else f"{self.type.value}:{self.name}"

    def matches(self, concrete: Resource) -> bool:
        """Whether this pattern covers ``concrete`` (a literal resource of a request)."""
        if self.type is ResourceType.ANY:
            return True
        if self.type is not concrete.type:
            return False
        if self.name.endswith("*"):
            return concrete.name.startswith(self.name[:-1])
        return self.name == concrete.name


@dataclass(frozen=True)
class Need:
    """What a request needs: one of ``actions`` on ``resource``."""

    resource: Resource
    actions: tuple[Action, ...]

    def __str__(self) -> str:
        return f"{'|'.join(a.value for a in self.actions)} on {self.resource}"


@dataclass(frozen=True)
class PolicyEntry:
    """One entry of a user's policy (RocketMQ ``PolicyEntry``): a resource pattern, actions, a
    decision and the source IPs it applies to (empty: every address)."""

    resource: Resource
    actions: tuple[Action, ...]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.actions:
            raise ConfigError(f"policy entry {self.resource}: no actions")
        for ip in self.source_ips:
            try:
                ipaddress.ip_network(ip, strict=False)
            except ValueError as exc:
                raise ConfigError(f"policy entry {self.resource}: source IP {ip!r} is not an "
                                  f"address or CIDR range") from exc

    def covers(self, need: Need, source_ip: str) -> bool:
        """Whether this entry applies to ``need`` from ``source_ip``."""
        if not self.resource.matches(need.resource):
            return False
        if Action.ALL not in self.actions and not any(a in self.actions for a in need.actions):
            return False
        return self.ip_matches(source_ip)

    def ip_matches(self, source_ip: str) -> bool:
        if not self.source_ips:
            return True
        try:
            addr = ipaddress.ip_address(source_ip.strip("[]"))
        except ValueError:
            return False
        return any(addr in ipaddress.ip_network(n, strict=False) for n in self.source_ips)


@dataclass(frozen=True)
class User:
    """A user (RocketMQ ``User``): the access key is the name, the secret key the password."""

    name: str
    secret_key: str
    type: UserType = UserType.NORMAL
    policy: tuple[PolicyEntry, ...] = ()


@dataclass
class Accounts:
    """Every user and policy: what an accounts file holds."""

    users: dict[str, User] = field(default_factory=dict)

    def decide(self, user: User, needs: list[Need], source_ip: str) -> str | None:
        """None when ``user`` may do what ``needs`` list from ``source_ip``; else why not."""
        if user.type is UserType.SUPER:
            return None
        for need in needs:
            found = [e for e in user.policy if e.covers(need, source_ip)]
            denied = [e for e in found if e.decision is Decision.DENY]
            if denied:
                return f"user {user.name!r} is denied {need} (policy entry {denied[0].resource})"
            if not found:
                return f"user {user.name!r} has no policy allowing {need} from {source_ip or '?'}"
        return None
