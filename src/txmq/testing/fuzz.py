"""Fuzzing txmq: targets (frame decoder, header decoders, store record and checkpoint codecs,
MessageExt codecs, the broker's request handling with a reopen check) and the engines that run
them (atheris when installed, else seeded random mutation). ``txmq fuzz`` is the command."""

from txmq.testing._fuzz import FuzzResult, atheris_available, finding_signature, mutate, replay, run_target
from txmq.testing._fuzz_targets import (
    HEADER_STRUCTS,
    HOSTILE_TOPICS,
    PROPERTY_VALUES,
    RESERVED_PROPERTIES,
    TARGETS,
    BrokerFinding,
    Target,
    UnexpectedErrors,
    broker_state,
    is_valid_topic,
)

__all__ = [
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
    "is_valid_topic",
    "mutate",
    "replay",
    "run_target",
]
