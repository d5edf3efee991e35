"""The controller of RocketMQ 5's controller mode: elects each broker group's master and keeps its
SyncStateSet, replicated over Raft (pysyncobj). See docs/controller.md."""

from txmq.controller._heartbeats import BrokerLive, HeartbeatTable
from txmq.controller._state import (
    FIRST_BROKER_CONTROLLER_ID,
    AlterSyncStateSet,
    ApplyBrokerId,
    Candidate,
    CleanBrokerData,
    ControllerEvent,
    ControllerState,
    ElectMaster,
    GroupView,
    Outcome,
    RegisterBroker,
)

__all__ = [
    "FIRST_BROKER_CONTROLLER_ID",
    "AlterSyncStateSet",
    "ApplyBrokerId",
    "BrokerLive",
    "Candidate",
    "CleanBrokerData",
    "ControllerEvent",
    "ControllerState",
    "ElectMaster",
    "GroupView",
    "HeartbeatTable",
    "Outcome",
    "RegisterBroker",
]
