"""Headers and bodies of RocketMQ 5's controller protocol (controller mode, automatic failover).

Request codes 1001-1013 (RocketMQ ``RequestCode``: CONTROLLER_ALTER_SYNC_STATE_SET ...
CONTROLLER_APPLY_BROKER_ID) and BROKER_HEARTBEAT 904 (its header is
:class:`~txmq.protocol.BrokerHeartbeatRequestHeader`, shared with the name server); response codes
CONTROLLER_* 2000-2016 are in :class:`~txmq.errors.ResponseCode`. Each header class is RocketMQ's
class of the same name (``remoting/protocol/header/controller``, ``.../controller/register``,
``.../controller/admin``), its wire names RocketMQ's field names; headers go through
:func:`~txmq.protocol.to_ext` / :func:`~txmq.protocol.from_ext` (MalformedHeader on bad input).

Bodies are fastjson JSON (RocketMQ ``RemotingSerializable``): :class:`SyncStateSet`,
:class:`ElectMasterResponseBody`, :class:`BrokerMemberGroup`, :class:`RoleChangeNotifyEntry`
fields; :func:`encode_controller_body` writes one, :func:`decode_controller_body` reads one (bare
integer map keys accepted) and raises MalformedHeader.

RocketMQ's ``invokeTime`` fields (the requester's wall clock) are accepted and never used: the
controller's replicated state takes no time from a request.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from txmq.errors import MalformedHeader
from txmq.protocol._headers import JLong
from txmq.protocol._route import encode_fastjson, quote_int_keys

__all__ = [
    "AlterSyncStateSetRequestHeader",
    "AlterSyncStateSetResponseHeader",
    "ApplyBrokerIdRequestHeader",
    "ApplyBrokerIdResponseHeader",
    "BrokerMemberGroup",
    "BrokerReplicasInfo",
    "CleanControllerBrokerDataRequestHeader",
    "ElectMasterRequestHeader",
    "ElectMasterResponseBody",
    "ElectMasterResponseHeader",
    "GetMetaDataResponseHeader",
    "GetNextBrokerIdRequestHeader",
    "GetNextBrokerIdResponseHeader",
    "GetReplicaInfoRequestHeader",
    "GetReplicaInfoResponseHeader",
    "NotifyBrokerRoleChangedRequestHeader",
    "RegisterBrokerToControllerRequestHeader",
    "RegisterBrokerToControllerResponseHeader",
    "ReplicaIdentity",
    "ReplicasInfo",
    "SyncStateSet",
    "decode_controller_body",
    "encode_controller_body",
]


class _Header(msgspec.Struct, kw_only=True, rename="camel"):
    """Base of the controller headers: snake_case attributes, camelCase wire names."""


class AlterSyncStateSetRequestHeader(_Header, kw_only=True):
    """CONTROLLER_ALTER_SYNC_STATE_SET (1001), from a group's master; body :class:`SyncStateSet`
    (the new set and the syncStateSetEpoch it replaces). RocketMQ ``AlterSyncStateSetRequestHeader``."""

    broker_name: str
    master_broker_id: JLong
    master_epoch: JLong
    invoke_time: JLong | None = None


class AlterSyncStateSetResponseHeader(_Header, kw_only=True):
    """Answer to 1001: the epoch of the set now in force (RocketMQ
    ``AlterSyncStateSetResponseHeader``)."""

    new_sync_state_set_epoch: JLong


class ElectMasterRequestHeader(_Header, kw_only=True):
    """CONTROLLER_ELECT_MASTER (1002): a broker asks for an election in its group (``broker_id`` =
    its own id; with ``designate_elect``, an operator names the broker to elect). RocketMQ
    ``ElectMasterRequestHeader``."""

    cluster_name: str = ""
    broker_name: str
    broker_id: JLong = -1
    designate_elect: bool = False
    invoke_time: JLong | None = None


class ElectMasterResponseHeader(_Header, kw_only=True):
    """Answer to 1002 (and fields of CONTROLLER_GET_REPLICA_INFO's): the group's master after the
    election; body :class:`ElectMasterResponseBody`. RocketMQ ``ElectMasterResponseHeader``."""

    master_broker_id: JLong | None = None
    master_address: str | None = None
    master_epoch: JLong | None = None
    sync_state_set_epoch: JLong | None = None


class RegisterBrokerToControllerRequestHeader(_Header, kw_only=True):
    """CONTROLLER_REGISTER_BROKER (1003): a broker with an applied id tells its address. RocketMQ
    ``register.RegisterBrokerToControllerRequestHeader``."""

    cluster_name: str
    broker_name: str
    broker_id: JLong
    broker_address: str
    invoke_time: JLong | None = None


class RegisterBrokerToControllerResponseHeader(_Header, kw_only=True):
    """Answer to 1003: the group's master as the controller knows it; body :class:`SyncStateSet`.
    RocketMQ ``register.RegisterBrokerToControllerResponseHeader``."""

    cluster_name: str | None = None
    broker_name: str | None = None
    master_broker_id: JLong | None = None
    master_address: str | None = None
    master_epoch: JLong | None = None
    sync_state_set_epoch: JLong | None = None


class GetReplicaInfoRequestHeader(_Header, kw_only=True):
    """CONTROLLER_GET_REPLICA_INFO (1004): a broker polls its group. RocketMQ
    ``GetReplicaInfoRequestHeader``."""

    broker_name: str


class GetReplicaInfoResponseHeader(_Header, kw_only=True):
    """Answer to 1004; body :class:`SyncStateSet`. RocketMQ ``GetReplicaInfoResponseHeader``."""

    master_broker_id: JLong | None = None
    master_address: str | None = None
    master_epoch: JLong | None = None


class GetMetaDataResponseHeader(_Header, kw_only=True):
    """Answer to CONTROLLER_GET_METADATA_INFO (1005): who leads the controllers (``controller_leader_address``
    is the leader's remoting address, None while there is none). RocketMQ ``GetMetaDataResponseHeader``;
    ``peers`` = the Raft peers, ``;``-separated."""

    group: str | None = None
    controller_leader_id: str | None = None
    controller_leader_address: str | None = None
    is_leader: bool = False
    peers: str | None = None


class NotifyBrokerRoleChangedRequestHeader(_Header, kw_only=True):
    """NOTIFY_BROKER_ROLE_CHANGED (1008), controller to broker after an election; body
    :class:`SyncStateSet`. RocketMQ ``NotifyBrokerRoleChangedRequestHeader``."""

    master_address: str | None = None
    master_epoch: JLong
    sync_state_set_epoch: JLong
    master_broker_id: JLong | None = None


class CleanControllerBrokerDataRequestHeader(_Header, kw_only=True):
    """CLEAN_BROKER_DATA (1011), an operator's: forget brokers of a group (``broker_controller_ids_to_clean``
    ``;``-separated ids, or the whole group when None). RocketMQ
    ``admin.CleanControllerBrokerDataRequestHeader``."""

    cluster_name: str | None = None
    broker_name: str
    broker_controller_ids_to_clean: str | None = None
    is_clean_living_broker: bool = False
    invoke_time: JLong | None = None


class GetNextBrokerIdRequestHeader(_Header, kw_only=True):
    """CONTROLLER_GET_NEXT_BROKER_ID (1012). RocketMQ ``register.GetNextBrokerIdRequestHeader``."""

    cluster_name: str
    broker_name: str


class GetNextBrokerIdResponseHeader(_Header, kw_only=True):
    """Answer to 1012: the id a new broker of the group should apply for (ids start at 1, RocketMQ
    ``MixAll.FIRST_BROKER_CONTROLLER_ID``). RocketMQ ``register.GetNextBrokerIdResponseHeader``."""

    cluster_name: str | None = None
    broker_name: str | None = None
    next_broker_id: JLong | None = None


class ApplyBrokerIdRequestHeader(_Header, kw_only=True):
    """CONTROLLER_APPLY_BROKER_ID (1013): claim ``applied_broker_id`` with a check code (a
    broker that re-applies the id it holds, with the same code, succeeds again). RocketMQ
    ``register.ApplyBrokerIdRequestHeader``."""

    cluster_name: str
    broker_name: str
    applied_broker_id: JLong
    register_check_code: str


class ApplyBrokerIdResponseHeader(_Header, kw_only=True):
    """Answer to 1013. RocketMQ ``register.ApplyBrokerIdResponseHeader``."""

    cluster_name: str | None = None
    broker_name: str | None = None


# --- bodies ---------------------------------------------------------------------------------------


class SyncStateSet(msgspec.Struct, kw_only=True, rename="camel"):
    """Body of 1001 (the proposed set), 1003, 1004 and 1008 answers: broker ids in sync with the
    master and the set's epoch. RocketMQ ``body.SyncStateSet``."""

    sync_state_set: list[int] = msgspec.field(default_factory=list)
    sync_state_set_epoch: int = 0


class BrokerMemberGroup(msgspec.Struct, kw_only=True, rename="camel"):
    """A broker group's members: broker id -> remoting address. RocketMQ ``body.BrokerMemberGroup``."""

    cluster: str = ""
    broker_name: str = ""
    broker_addrs: dict[int, str] = msgspec.field(default_factory=dict)


class ElectMasterResponseBody(msgspec.Struct, kw_only=True, rename="camel"):
    """Body of 1002's answer. RocketMQ ``body.ElectMasterResponseBody``."""

    broker_member_group: BrokerMemberGroup | None = None
    sync_state_set: list[int] = msgspec.field(default_factory=list)


class ReplicaIdentity(msgspec.Struct, kw_only=True, rename="camel"):
    """One broker of a group as the controller sees it. RocketMQ
    ``BrokerReplicasInfo.ReplicaIdentity``."""

    broker_name: str
    broker_id: int
    broker_address: str
    alive: bool = False


class ReplicasInfo(msgspec.Struct, kw_only=True, rename="camel"):
    """One group's master, epochs and members in and out of the SyncStateSet. RocketMQ
    ``BrokerReplicasInfo.ReplicasInfo``."""

    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int = 0
    sync_state_set_epoch: int = 0
    in_sync_replicas: list[ReplicaIdentity] = msgspec.field(default_factory=list)
    not_in_sync_replicas: list[ReplicaIdentity] = msgspec.field(default_factory=list)


class BrokerReplicasInfo(msgspec.Struct, kw_only=True, rename="camel"):
    """Body of CONTROLLER_GET_SYNC_STATE_DATA's (1006) answer, by brokerName (the request's body
    is a JSON list of brokerNames). RocketMQ ``body.BrokerReplicasInfo``."""

    replicas_info_table: dict[str, ReplicasInfo] = msgspec.field(default_factory=dict)


B = TypeVar("B", bound=msgspec.Struct)


def encode_controller_body(body: msgspec.Struct) -> bytes:
    """UTF-8 fastjson JSON of a controller body (integer map keys bare, as RocketMQ writes them)."""
    return encode_fastjson(body)


def decode_controller_body(data: bytes, cls: type[B]) -> B:
    """Read body ``cls`` from JSON (fastjson's bare integer keys accepted).

    Raises:
        MalformedHeader: not JSON, or not the shape of ``cls``.
    """
    try:
        return msgspec.json.decode(quote_int_keys(bytes(data)), type=cls)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError) as exc:
        raise MalformedHeader(f"bad {cls.__name__} body: {exc}") from exc
