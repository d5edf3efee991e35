"""The controller of RocketMQ 5's controller mode: elects each broker group's master and keeps its
SyncStateSet, replicated over Raft (pysyncobj). See docs/controller.md."""

from txmq.extras import require_extra as _require_extra

_require_extra("broker", "txmq.controller", "pysyncobj")

from txmq.controller._heartbeats import BrokerLive, HeartbeatTable
from txmq.controller._raft import ControllerRaft
from txmq.controller._server import (
    CONTROLLER_HEARTBEAT_TIMEOUT_MS,
    CONTROLLER_LEASE_MS,
    CONTROLLER_PORT,
    ControllerServer,
    run_controller,
)
from txmq.controller._service import ControllerService
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
    "CONTROLLER_HEARTBEAT_TIMEOUT_MS",
    "CONTROLLER_LEASE_MS",
    "CONTROLLER_PORT",
    "FIRST_BROKER_CONTROLLER_ID",
    "AlterSyncStateSet",
    "ApplyBrokerId",
    "BrokerLive",
    "Candidate",
    "CleanBrokerData",
    "ControllerEvent",
    "ControllerRaft",
    "ControllerServer",
    "ControllerService",
    "ControllerState",
    "ElectMaster",
    "GroupView",
    "HeartbeatTable",
    "Outcome",
    "RegisterBroker",
    "run_controller",
]
