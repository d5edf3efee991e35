"""The controller's replicated state: broker groups, their masters, epochs and SyncStateSets.

Sans-IO and deterministic: :meth:`ControllerState.apply` is a pure function of the state and one
event (a msgspec struct below). Every controller replica applies the same events in the same
(Raft log) order and so holds the same state; no clock, randomness or liveness is read inside.
The leader reads liveness from its :class:`~txmq.controller.HeartbeatTable` and writes it into the
event (``alive``, ``candidates``) before proposing it.

Sources: RocketMQ ``ReplicasInfoManager`` (applyBrokerId, registerBroker, alterSyncStateSet,
electMaster), ``DefaultElectPolicy``, ``SyncStateInfo``, ``BrokerReplicaInfo``; the response codes
are RocketMQ's (``ResponseCode.CONTROLLER_*``).
"""

from __future__ import annotations

import msgspec

from txmq.errors import ResponseCode

__all__ = [
    "FIRST_BROKER_CONTROLLER_ID",
    "AlterSyncStateSet",
    "ApplyBrokerId",
    "Candidate",
    "CleanBrokerData",
    "ControllerEvent",
    "ControllerState",
    "ElectMaster",
    "GroupView",
    "Outcome",
    "RegisterBroker",
]

FIRST_BROKER_CONTROLLER_ID = 1
"""Broker ids handed out by the controller start here (RocketMQ ``MixAll.FIRST_BROKER_CONTROLLER_ID``)."""


class Candidate(msgspec.Struct, frozen=True, array_like=True):
    """A live broker as its last heartbeat describes it (the leader fills these in)."""

    broker_id: int
    epoch: int
    max_offset: int
    priority: int


class ApplyBrokerId(msgspec.Struct, frozen=True, tag=True):
    """CONTROLLER_APPLY_BROKER_ID: claim ``broker_id`` in a group with a check code."""

    cluster_name: str
    broker_name: str
    broker_id: int
    check_code: str


class RegisterBroker(msgspec.Struct, frozen=True, tag=True):
    """CONTROLLER_REGISTER_BROKER: an applied id reports its remoting address."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str


class AlterSyncStateSet(msgspec.Struct, frozen=True, tag=True):
    """CONTROLLER_ALTER_SYNC_STATE_SET from the master; ``sync_state_set_epoch`` is the epoch of
    the set it replaces; ``alive`` = the ids the leader sees alive now."""

    broker_name: str
    master_broker_id: int
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    alive: frozenset[int]


class ElectMaster(msgspec.Struct, frozen=True, tag=True):
    """An election in one group: ``requester`` = the asking broker's id (-1 when the controller
    triggers it); ``candidates`` = every live broker of the group (live master included) with its
    heartbeat data; ``designate`` = elect ``requester`` if it may be elected (admin)."""

    broker_name: str
    requester: int
    candidates: tuple[Candidate, ...]
    designate: bool = False


class CleanBrokerData(msgspec.Struct, frozen=True, tag=True):
    """CLEAN_BROKER_DATA: forget ``broker_ids`` of a group, or the whole group when None."""

    broker_name: str
    broker_ids: frozenset[int] | None = None


ControllerEvent = ApplyBrokerId | RegisterBroker | AlterSyncStateSet | ElectMaster | CleanBrokerData


class GroupView(msgspec.Struct, frozen=True):
    """A snapshot of one broker group (RocketMQ ``BrokerReplicaInfo`` + ``SyncStateInfo``).
    ``master_epoch`` 0 = never elected; ``master_broker_id`` None = no master now."""

    cluster_name: str
    broker_name: str
    brokers: dict[int, str]
    master_broker_id: int | None
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: frozenset[int]

    @property
    def master_address(self) -> str | None:
        return None if self.master_broker_id is None else self.brokers.get(self.master_broker_id)

    @property
    def next_broker_id(self) -> int:
        """The id a new broker of the group applies for (RocketMQ ``getNextAssignBrokerId``)."""
        return max(self.brokers, default=FIRST_BROKER_CONTROLLER_ID - 1) + 1


class Outcome(msgspec.Struct, frozen=True):
    """What an event did: ``code`` SUCCESS or a CONTROLLER_* code with RocketMQ's ``remark``;
    ``group`` = the group after it (None if it does not exist); ``changed_master`` when an election
    made a new master (the controller then notifies the group)."""

    code: ResponseCode
    remark: str = ""
    group: GroupView | None = None
    changed_master: bool = False


class _Group(msgspec.Struct):
    cluster_name: str
    broker_name: str
    brokers: dict[int, str] = msgspec.field(default_factory=dict)
    check_codes: dict[int, str] = msgspec.field(default_factory=dict)
    master_broker_id: int | None = None
    master_epoch: int = 0
    sync_state_set_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()

    def view(self) -> GroupView:
        return GroupView(self.cluster_name, self.broker_name, dict(self.brokers),
                         self.master_broker_id, self.master_epoch, self.sync_state_set_epoch,
                         self.sync_state_set)


def _rank(c: Candidate) -> tuple[int, int, int, int]:
    """DefaultElectPolicy's order: epoch desc, maxOffset desc, electionPriority asc (then id)."""
    return (-c.epoch, -c.max_offset, c.priority, c.broker_id)


class ControllerState:
    """Every broker group the controllers know, keyed by brokerName (RocketMQ keys them so too).

    :meth:`apply` is the only mutator; :meth:`group` and :meth:`groups` read. :meth:`dump` /
    :meth:`load` give a JSON snapshot (the Raft library's log compaction stores the object).
    """

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}

    def group(self, broker_name: str) -> GroupView | None:
        g = self._groups.get(broker_name)
        return None if g is None else g.view()

    def groups(self) -> list[GroupView]:
        return [g.view() for g in self._groups.values()]

    def dump(self) -> bytes:
        return msgspec.json.encode(list(self._groups.values()))

    @classmethod
    def load(cls, data: bytes) -> ControllerState:
        state = cls()
        for g in msgspec.json.decode(data, type=list[_Group]):
            state._groups[g.broker_name] = g
        return state

    def apply(self, event: ControllerEvent) -> Outcome:
        """Apply one event; never raises on any event (a refused one changes nothing)."""
        if isinstance(event, ApplyBrokerId):
            return self._apply_broker_id(event)
        if isinstance(event, RegisterBroker):
            return self._register(event)
        if isinstance(event, AlterSyncStateSet):
            return self._alter(event)
        if isinstance(event, ElectMaster):
            return self._elect(event)
        return self._clean(event)

    def _outcome(self, g: _Group | None, code: ResponseCode = ResponseCode.SUCCESS,
                 remark: str = "", changed: bool = False) -> Outcome:
        return Outcome(code, remark, None if g is None else g.view(), changed)

    def _apply_broker_id(self, e: ApplyBrokerId) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None:
            if e.broker_id != FIRST_BROKER_CONTROLLER_ID:
                return self._outcome(None, ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                                     f"broker-set: {e.broker_name} does not exist; the first "
                                     f"broker id is {FIRST_BROKER_CONTROLLER_ID}")
            g = self._groups[e.broker_name] = _Group(e.cluster_name, e.broker_name)
        if e.broker_id < FIRST_BROKER_CONTROLLER_ID:
            return self._outcome(g, ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                                 f"broker id {e.broker_id} < {FIRST_BROKER_CONTROLLER_ID}")
        held = g.check_codes.get(e.broker_id)
        if held is not None and held != e.check_code:
            return self._outcome(g, ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                                 f"broker id {e.broker_id} of {e.broker_name} is taken")
        g.check_codes[e.broker_id] = e.check_code
        g.brokers.setdefault(e.broker_id, "")
        return self._outcome(g)

    def _register(self, e: RegisterBroker) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None or e.broker_id not in g.brokers:
            return self._outcome(g, ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                                 f"broker {e.broker_name}/{e.broker_id} has not applied an id")
        g.brokers[e.broker_id] = e.address
        return self._outcome(g)

    def _alter(self, e: AlterSyncStateSet) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None:
            return self._outcome(None, ResponseCode.CONTROLLER_INVALID_REQUEST,
                                 f"broker-set {e.broker_name} does not exist")
        if g.master_broker_id is None or g.master_broker_id != e.master_broker_id:
            return self._outcome(g, ResponseCode.CONTROLLER_INVALID_MASTER,
                                 f"{e.master_broker_id} is not the master of {e.broker_name}")
        if e.master_epoch != g.master_epoch:
            return self._outcome(g, ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                                 f"master epoch {e.master_epoch} != {g.master_epoch}")
        if e.sync_state_set_epoch != g.sync_state_set_epoch:
            return self._outcome(g, ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                                 f"syncStateSet epoch {e.sync_state_set_epoch} != "
                                 f"{g.sync_state_set_epoch}")
        if e.master_broker_id not in e.sync_state_set or e.sync_state_set == g.sync_state_set:
            return self._outcome(g, ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                                 "the new syncStateSet must contain the master and differ")
        unknown = e.sync_state_set - g.brokers.keys()
        if unknown:
            return self._outcome(g, ResponseCode.CONTROLLER_INVALID_REPLICAS,
                                 f"unknown brokers {sorted(unknown)}")
        dead = e.sync_state_set - e.alive
        if dead:
            return self._outcome(g, ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
                                 f"brokers {sorted(dead)} are not alive")
        g.sync_state_set = e.sync_state_set
        g.sync_state_set_epoch += 1
        return self._outcome(g)

    def _elect(self, e: ElectMaster) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None:
            return self._outcome(None, ResponseCode.CONTROLLER_INVALID_REQUEST,
                                 f"broker-set {e.broker_name} does not exist")
        alive = {c.broker_id: c for c in e.candidates if c.broker_id in g.brokers}
        if g.master_epoch == 0:  # first election: the requester (RocketMQ isFirstTimeForElect)
            chosen = e.requester if e.requester in alive else None
        else:
            chosen = self._choose(g, e, alive)
            if chosen is not None and chosen == g.master_broker_id:
                return self._outcome(g, ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                                     "the old master is still valid")
        if chosen is None:
            g.master_broker_id = None  # the old master, if any, is no longer valid
            return self._outcome(g, ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                                 f"no live SyncStateSet member of {e.broker_name} to elect")
        g.master_broker_id = chosen
        g.master_epoch += 1
        g.sync_state_set_epoch += 1
        g.sync_state_set = frozenset({chosen})
        return self._outcome(g, changed=True)

    @staticmethod
    def _choose(g: _Group, e: ElectMaster, alive: dict[int, Candidate]) -> int | None:
        """DefaultElectPolicy: live SyncStateSet members only (no unclean election)."""
        eligible = [c for i, c in alive.items() if i in g.sync_state_set]
        if e.designate:
            return e.requester if any(c.broker_id == e.requester for c in eligible) else None
        if g.master_broker_id is not None and g.master_broker_id in alive:
            return g.master_broker_id
        return min(eligible, key=_rank).broker_id if eligible else None

    def _clean(self, e: CleanBrokerData) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None:
            return self._outcome(None, ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                                 f"broker-set {e.broker_name} does not exist")
        if e.broker_ids is None:
            del self._groups[e.broker_name]
            return self._outcome(None)
        for bid in e.broker_ids:
            g.brokers.pop(bid, None)
            g.check_codes.pop(bid, None)
        g.sync_state_set = g.sync_state_set - e.broker_ids
        if g.master_broker_id in e.broker_ids:
            g.master_broker_id = None
        return self._outcome(g)
