"""ACL: RocketMQ-compatible authentication and ACL 2.0-style authorization for both doors.

The model (:class:`Accounts`, users, policy entries, actions, resources) and the check
(:class:`AclGuard`) are sans-IO; the accounts file (:func:`load_accounts`, :func:`save_accounts`,
:class:`AccountsWatcher`) is the only part that touches the disk. See ``docs/security.md``.
"""

from txmq.broker.acl._file import (
    AccountsWatcher,
    load_accounts,
    parse_accounts,
    render_accounts,
    save_accounts,
)
from txmq.broker.acl._guard import AclGuard, Refusal, source_ip
from txmq.broker.acl._model import (
    Accounts,
    Action,
    Decision,
    Need,
    PolicyEntry,
    Resource,
    ResourceType,
    User,
    UserType,
)
from txmq.broker.acl._rules import (
    GRPC_RULES,
    REMOTING_RULES,
    HalfTopic,
    Rule,
    RuleKind,
    Scope,
    rules_markdown,
)

__all__ = [
    "GRPC_RULES",
    "REMOTING_RULES",
    "Accounts",
    "AccountsWatcher",
    "AclGuard",
    "Action",
    "Decision",
    "HalfTopic",
    "Need",
    "PolicyEntry",
    "Refusal",
    "Resource",
    "ResourceType",
    "Rule",
    "RuleKind",
    "Scope",
    "User",
    "UserType",
    "load_accounts",
    "parse_accounts",
    "render_accounts",
    "rules_markdown",
    "save_accounts",
    "source_ip",
]
