"""Helpers for tests, ours and our users': a real broker process on a free port, a sans-IO broker
harness with a hand-driven clock, a polling wait for conditions on real processes, a Spark standalone
cluster of separate JVMs (:class:`SparkCluster`), test hosts with their own addresses in network
namespaces with partitions, delays and losses between them (:class:`Hosts`), and Debian's Chromium
under Playwright for browser tests (:mod:`txmq.testing.browser`)."""

from txmq.testing._broker import BrokerProcess, run_broker
from txmq.testing._certs import TestCertificates, make_test_certificates
from txmq.testing._cluster import ClusterProcess, NamesrvProcess, run_cluster
from txmq.testing._controller import ControllerProcess
from txmq.testing._cpu import process_cpu_s
from txmq.testing._harness import END_TYPES, BrokerHarness
from txmq.testing._netns import ROOT, Hosts, netns_unavailable
from txmq.testing._ports import free_port
from txmq.testing._spark_cluster import FAST_START_JAVA_OPTIONS, SparkCluster, SparkClusterError
from txmq.testing._wait import wait_until
from txmq.testing.browser import ChromiumUnavailable, chromium, ensure_chromium

__all__ = [
    "END_TYPES",
    "FAST_START_JAVA_OPTIONS",
    "ROOT",
    "BrokerHarness",
    "BrokerProcess",
    "ChromiumUnavailable",
    "ClusterProcess",
    "ControllerProcess",
    "Hosts",
    "NamesrvProcess",
    "SparkCluster",
    "SparkClusterError",
    "TestCertificates",
    "chromium",
    "ensure_chromium",
    "free_port",
    "make_test_certificates",
    "netns_unavailable",
    "process_cpu_s",
    "run_broker",
    "run_cluster",
    "wait_until",
]
