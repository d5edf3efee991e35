"""The check at both doors, sans-IO: authenticate the caller, then authorize what it asks.

Remoting: the request's ``AccessKey`` names the user and its ``Signature`` must be the one its secret
key gives over the request (:func:`~txmq.protocol.remoting_content`); RocketMQ's
``DefaultAuthenticationHandler`` / ``PlainAccessValidator#validate`` check the same. A refusal is
answered ``NO_PERMISSION`` (16) with a remark saying why, and the request is not handled.

gRPC: the ``authorization`` metadata names the user and signs ``x-mq-date-time``, which must be
within ``limits.ACL_GRPC_DATE_TIME_SKEW_MAX_MS`` of the broker's clock shifted by some time zone
offset (the official clients sign their local time labelled ``Z``; see :func:`_fresh`). No or bad
credentials answer ``UNAUTHORIZED`` (40100); a request the policies deny answers ``FORBIDDEN``
(40300). (RocketMQ's proxy, ``ResponseBuilder#buildStatus``, answers UNAUTHORIZED to both; txmq
uses the protocol's FORBIDDEN for a denial, so a client can tell a wrong key from a missing
permission.)
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txmq import limits
from txmq.broker.acl._model import Accounts, Need, User
from txmq.broker.acl._rules import GRPC_RULES, REMOTING_RULES, HalfTopic, RuleKind, Scope
from txmq.errors import ResponseCode
from txmq.protocol import (
    ACCESS_KEY,
    AUTHORIZATION,
    DATE_TIME,
    SIGNATURE,
    Command,
    parse_grpc_authorization,
    parse_grpc_date_time,
    remoting_content,
    remoting_signature,
)

__all__ = ["AclGuard", "Refusal", "source_ip"]


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused. ``denied`` False: no or bad credentials (gRPC UNAUTHORIZED);
    True: the credentials are good but the policies do not allow it (gRPC FORBIDDEN)."""

    denied: bool
    reason: str


def source_ip(peer: str) -> str:
    """The IP of a peer address: ``1.2.3.4:5`` (remoting), ``ipv4:1.2.3.4:5`` or
    ``ipv6:[::1]:5`` (grpc ``context.peer()``) → ``1.2.3.4`` / ``::1``."""
    for scheme in ("ipv4:", "ipv6:"):
        peer = peer.removeprefix(scheme)
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")


def _fresh(signed_ms: int, now_ms: int) -> bool:
    """Whether a signed ``x-mq-date-time`` is the broker's time, give or take the clock skew and
    the client's time zone (clients sign local time labelled UTC): ``now + zone offset ± skew``
    for some offset in ``ACL_GRPC_ZONE_OFFSET_MIN_MS`` … ``ACL_GRPC_ZONE_OFFSET_MAX_MS``."""
    skew = limits.ACL_GRPC_DATE_TIME_SKEW_MAX_MS
    return (now_ms + limits.ACL_GRPC_ZONE_OFFSET_MIN_MS - skew <= signed_ms
            <= now_ms + limits.ACL_GRPC_ZONE_OFFSET_MAX_MS + skew)


class AclGuard:
    """Authentication and authorization against the users and policies of ``accounts``.

    Args:
        accounts: the users and policies (swap :attr:`accounts` to reload).
        cluster: the broker's cluster name, the resource ``Cluster:<name>`` of admin requests.
        half_topic: the REAL_TOPIC of the half message an end request names, or None
            (:meth:`~txmq.broker.transaction.TransactionService.half_topic`): an end of a
            transaction needs Pub on that topic. Without it (no broker), only on the topic the
            request claims. Check a request just before it is handled, so the half it names
            cannot appear in between.
    """

    def __init__(self, accounts: Accounts, cluster: str,
                 half_topic: HalfTopic | None = None) -> None:
        self.accounts = accounts
        self.cluster = cluster
        self.scope = Scope(cluster) if half_topic is None else Scope(cluster, half_topic)

    # -- remoting ---------------------------------------------------------------------------------
    def check_remoting(self, cmd: Command, source_ip: str) -> Refusal | None:
        """None if ``cmd`` from ``source_ip`` may be handled, else the :class:`Refusal`."""
        rule = REMOTING_RULES.get(cmd.code)
        if rule is None:
            return Refusal(True, f"request code {cmd.code} is not in the authorization table")
        if rule.kind == RuleKind.PUBLIC:
            return None
        user = self._remoting_user(cmd)
        if isinstance(user, Refusal):
            return user
        return self._authorize(user, rule.needs, cmd, source_ip)

    def _remoting_user(self, cmd: Command) -> User | Refusal:
        return self._signed_user(cmd.ext, cmd.body, cmd.version)

    def check_fields(self, fields: dict[str, str], source_ip: str,
                     needs: list[Need]) -> Refusal | None:
        """None if ``fields``, signed as a remoting request's ext fields with no body (``AccessKey``
        and ``Signature`` among them), carry a good signature of a user allowed ``needs`` from
        ``source_ip``; else the :class:`Refusal`. The HA handshake's check
        (:func:`~txmq.protocol.ha_hello_fields`)."""
        user = self._signed_user(fields, b"", None)
        if isinstance(user, Refusal):
            return user
        why = self.accounts.decide(user, needs, source_ip)
        return None if why is None else Refusal(True, why)

    def _signed_user(self, ext: dict[str, str], body: bytes, version: int | None) -> User | Refusal:
        ak = ext.get(ACCESS_KEY, "")
        sig = ext.get(SIGNATURE, "")
        if not ak or not sig:
            return Refusal(False, "no credentials: ACL is on and the request has no AccessKey and "
                                  "Signature")
        user = self.accounts.users.get(ak)
        if user is None:
            return Refusal(False, f"unknown access key {ak!r}")
        want = remoting_signature(remoting_content(ext, body, version), user.secret_key)
        if not hmac.compare_digest(want.encode(), sig.encode()):
            return Refusal(False, f"signature check failed for access key {ak!r}")
        return user

    def refuse_remoting(self, cmd: Command, refusal: Refusal) -> Command:
        """The NO_PERMISSION response to ``cmd``."""
        return cmd.response(ResponseCode.NO_PERMISSION, f"ACL: {refusal.reason}")

    # -- gRPC -------------------------------------------------------------------------------------
    def check_grpc(self, rpc: str, request: Any, metadata: Mapping[str, str], source_ip: str,
                   now_ms: int) -> Refusal | None:
        """None if rpc ``rpc`` with parsed ``request`` may be served, else the :class:`Refusal`.
        ``metadata`` is the call's invocation metadata (lower-case keys)."""
        rule = GRPC_RULES.get(rpc)
        if rule is None:
            return Refusal(True, f"rpc {rpc} is not in the authorization table")
        if rule.kind in (RuleKind.PUBLIC, RuleKind.UNSUPPORTED):
            return None
        user = self._grpc_user(metadata, now_ms)
        if isinstance(user, Refusal):
            return user
        return self._authorize(user, rule.needs, request, source_ip)

    def _grpc_user(self, metadata: Mapping[str, str], now_ms: int) -> User | Refusal:
        header = metadata.get(AUTHORIZATION, "")
        if not header:
            return Refusal(False, "no credentials: ACL is on and the call has no authorization "
                                  "metadata")
        date_time = metadata.get(DATE_TIME, "")
        try:
            ak, sig = parse_grpc_authorization(header)
            signed_ms = parse_grpc_date_time(date_time)
        except ValueError as exc:
            return Refusal(False, f"bad authorization metadata: {exc}")
        if not _fresh(signed_ms, now_ms):
            return Refusal(False, f"{DATE_TIME} {date_time} is too far from the broker's clock "
                                  f"(expired or replayed)")
        if not ak:
            return Refusal(False, "no credentials: the authorization metadata names no access key")
        user = self.accounts.users.get(ak)
        if user is None:
            return Refusal(False, f"unknown access key {ak!r}")
        want = hmac.new(user.secret_key.encode(), date_time.encode(), "sha1").digest()
        if not hmac.compare_digest(want, sig):
            return Refusal(False, f"signature check failed for access key {ak!r}")
        return user

    # -- both -------------------------------------------------------------------------------------
    def _authorize(self, user: User, needs: Any, request: Any, source_ip: str) -> Refusal | None:
        if needs is None:  # credentials only
            return None
        try:
            wanted: list[Need] = needs(request, self.scope)
        except Exception as exc:  # a body that does not parse: refused, never handled unchecked
            return Refusal(True, f"cannot read the request to authorize it: {exc}")
        why = self.accounts.decide(user, wanted, source_ip)
        return None if why is None else Refusal(True, why)
