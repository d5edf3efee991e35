"""Fuzzing txmq: targets (RocketMQ remoting frames in both serialize types, headers and bodies,
store record and checkpoint codecs, RocketMQ's binary MessageExt and batch codecs, the broker's
request handling with a reopen check) and the engines that run them (atheris when installed, else
seeded random mutation). ``txmq fuzz`` is the command."""

from txmq.testing._fuzz import FuzzResult, atheris_available, finding_signature, mutate, replay, run_target
from txmq.testing._fuzz_targets import (
    HEADER_CLASSES,
    HEADER_STRUCTS,
    HOSTILE_TOPICS,
    PROPERTY_VALUES,
    RESERVED_PROPERTIES,
    TARGETS,
    BrokerFinding,
    Target,
    UnexpectedErrors,
    broker_state,
    is_header_remark,
    is_valid_topic,
    wire_round_trip,
)

__all__ = [
    "HEADER_CLASSES",
    "HEADER_STRUCTS",
    "HOSTILE_TOPICS",
    "PROPERTY_VALUES",
    "RESERVED_PROPERTIES",
    "TARGETS",
    "BrokerFinding",
    "FuzzResult",
    "Target",
    "UnexpectedErrors",
    "atheris_available",
    "broker_state",
    "finding_signature",
    "is_header_remark",
    "is_valid_topic",
    "mutate",
    "replay",
    "run_target",
    "wire_round_trip",
]
