"""Records read from a replica while their master is down (README, Redis
Cluster, "Where each partition is"), as a user holding exactly
``streamsub.testing.ACL_RULE`` (README, Security: "a test runs ... every admin
call as a user holding exactly this rule, ... on a Redis Cluster"; "On a
cluster, create the user on every node"). The replica path asks another node
``CLUSTER NODES`` for the master's replicas and sends ``READONLY`` to one."""

from __future__ import annotations

import time

import streamsub.blocking
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import as_acl_user
from tests.cluster.test_describe_during_failover import (
    ANSWER_WITHIN,
    _place,
    _role,
)


def test_an_acl_user_reads_the_records_from_the_replica_of_a_killed_master(
    slow_cluster: RedisClusterServers,
) -> None:
    """As a user holding exactly ACL_RULE: with the master holding a topic's
    records SIGKILLed, get_topic, list_subscriptions and locate_partitions
    answer within a few seconds with what they gave before, before the
    replica is promoted."""
    cluster = slow_cluster
    url = as_acl_user(cluster, "app", "app-pw")
    with streamsub.blocking.connect(cluster.url) as admin:
        placed = _place(cluster, admin)
    with streamsub.blocking.connect(url) as client:
        assert client.get_topic(placed.topic).partitions == 16
        placed.victim.kill()
        for call, expected in (
            (lambda: client.get_topic(placed.topic).partitions, 16),
            (
                lambda: [s.name for s in client.list_subscriptions(placed.topic)],
                placed.subscriptions,
            ),
            (lambda: client.locate_partitions(placed.topic), placed.before),
        ):
            started = time.monotonic()
            assert call() == expected
            assert time.monotonic() - started < ANSWER_WITHIN
    assert _role(cluster, placed.replica) == "slave"
