"""Helpers for testing code that uses streamsub, and for testing streamsub.

``redis_server()`` runs a private, real redis-server for a test session (TLS
only with ``make_tls_files()``); ``redis_cluster()`` a private Redis Cluster
(3 masters and 3 replicas by default). ``ACL_RULE`` is the least-privilege ACL rule
for a streamsub user (``ACL SETUSER name on >password`` + the rule).
``CONFORMANCE_CHECKS`` and the ``check_*`` functions are the behaviour every
backend must show: each takes a connected client and raises AssertionError
saying what is wrong.
"""

from ._backends.redis._acl import ACL_RULE
from ._cluster_server import RedisClusterServers, redis_cluster
from ._conformance import (
    CONFORMANCE_CHECKS,
    check_auto_ack_exception_nacks,
    check_end_to_end_ordering_keys,
    check_flow_control_bounds_concurrency,
    check_manual_ack_and_nack,
    check_publish_returns_ids,
    check_start_latest_vs_earliest,
    check_stop_flushes_acks,
    check_sync_handler,
)
from ._server import RedisServer, TlsFiles, find_redis_server, make_tls_files, redis_server

__all__ = [
    "ACL_RULE",
    "CONFORMANCE_CHECKS",
    "RedisClusterServers",
    "RedisServer",
    "TlsFiles",
    "check_auto_ack_exception_nacks",
    "check_end_to_end_ordering_keys",
    "check_flow_control_bounds_concurrency",
    "check_manual_ack_and_nack",
    "check_publish_returns_ids",
    "check_start_latest_vs_earliest",
    "check_stop_flushes_acks",
    "check_sync_handler",
    "find_redis_server",
    "make_tls_files",
    "redis_cluster",
    "redis_server",
]
