"""``topic describe``, ``locate_partitions``, ``get_topic`` and
``list_subscriptions`` while the master holding the topic's records is down
and not yet replaced: the records are read from that master's replica
(``READONLY``), so an operator sees the topic during a failover.

Each test runs its own cluster with a 15 s ``cluster-node-timeout``: the
replica is promoted only after about 18 s (measured), so answers within a few seconds
come from the replica's copy, not from a promoted master (checked: it is
still a replica afterwards). A silent (SIGSTOPped) master is tested on a
connected client only: connecting anew waits out socket timeouts in
redis-py's discovery and the server checks, outside the record reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable

import pytest
from typer.testing import CliRunner

import streamsub
import streamsub.blocking
from streamsub._backends.redis import _keys
from streamsub._backends.redis._slots import key_slot
from streamsub._server import RedisServer
from streamsub.cli import app
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import owner_port, replica_port

ANSWER_WITHIN = 5.0
"""Seconds a describe or locate may take while the master is down: well under
the promotion (about 18 s after the kill)."""


@pytest.fixture
def cluster(slow_cluster: RedisClusterServers) -> RedisClusterServers:
    """The tests here run on a cluster slow to promote a replica."""
    return slow_cluster


def _cli(url: str, *args: str) -> str:
    runner = CliRunner(env={"STREAMSUB_URL": url, "COLUMNS": "300"})
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _name_on(
    cluster: RedisClusterServers, port: int, prefix: str, key: Callable[[str], str]
) -> str:
    """The first ``<prefix>-<n>`` whose record ``key`` is in a slot of the master at ``port``."""
    return next(
        name
        for name in (f"{prefix}-{n}" for n in range(1000))
        if owner_port(cluster, key_slot(key(name))) == port
    )


def _role(cluster: RedisClusterServers, port: int) -> str:
    """What the node at ``port`` says it is: ``master`` or ``slave``."""
    node = cluster.node(port)
    try:
        return str(node.info("replication")["role"])
    finally:
        node.close()


@dataclasses.dataclass
class _Placed:
    """A 16-partition topic and two subscriptions, as described before a master stops."""

    topic: str
    subscriptions: list[str]
    victim: RedisServer
    """The master holding the topic's record, a subscription's and the list of
    subscriptions (all that describe reads)."""
    replica: int
    before: list[streamsub.PartitionNode]
    described: dict[str, object]


def _place(cluster: RedisClusterServers, client: streamsub.blocking.Client) -> _Placed:
    """Create the topic (2,000 messages in it) and its subscriptions: one whose
    record is on the victim, one whose record is on another master."""
    victim = owner_port(cluster, key_slot(_keys.SUBSCRIPTIONS))
    other = next(p for p in cluster.master_ports() if p != victim)
    topic = _name_on(cluster, victim, "described", _keys.topic_key)
    subscriptions = sorted(
        [
            _name_on(cluster, victim, "watcher", _keys.subscription_key),
            _name_on(cluster, other, "auditor", _keys.subscription_key),
        ]
    )
    client.create_topic(topic, partitions=16)
    for subscription in subscriptions:
        client.create_subscription(subscription, topic=topic)
    ids = client.publish_many(topic, [b"m%d" % i for i in range(2000)]).result()
    assert len(set(ids)) == 2000
    before = client.locate_partitions(topic)
    assert {p.address for p in before} == {f"127.0.0.1:{p}" for p in cluster.master_ports()}
    described = json.loads(_cli(cluster.url, "topic", "describe", topic, "--json"))
    assert described["subscriptions"] == subscriptions
    return _Placed(
        topic,
        subscriptions,
        next(s for s in cluster.servers if s.port == victim),
        replica_port(cluster, victim),
        before,
        described,
    )


def _check_records(client: streamsub.blocking.Client, placed: _Placed) -> None:
    """locate_partitions, get_topic and list_subscriptions give what they gave
    before, each within ANSWER_WITHIN seconds."""
    for call, expected in (
        (lambda: client.locate_partitions(placed.topic), placed.before),
        (lambda: client.get_topic(placed.topic).partitions, 16),
        (lambda: [s.name for s in client.list_subscriptions(placed.topic)], placed.subscriptions),
    ):
        started = time.monotonic()
        assert call() == expected
        assert time.monotonic() - started < ANSWER_WITHIN


def test_describe_reads_the_records_from_the_replica_of_a_killed_master(
    cluster: RedisClusterServers,
) -> None:
    """With the master holding a topic's records SIGKILLed (connections
    refused), locate_partitions, get_topic and list_subscriptions on a client
    made before and on one made after, and `topic describe --json`, each
    answer within a few seconds, well before the replica is promoted, with the
    placement and the subscriptions of before."""
    with streamsub.blocking.connect(cluster.url) as client:
        placed = _place(cluster, client)
        placed.victim.kill()
        _check_records(client, placed)
    with streamsub.blocking.connect(cluster.url) as fresh:
        _check_records(fresh, placed)
    started = time.monotonic()
    during = json.loads(_cli(cluster.url, "topic", "describe", placed.topic, "--json"))
    assert time.monotonic() - started < ANSWER_WITHIN
    assert during == placed.described
    # Answered by the replica, not by a promoted master.
    assert _role(cluster, placed.replica) == "slave"


def test_describe_reads_the_records_from_the_replica_of_a_silent_master(
    cluster: RedisClusterServers,
) -> None:
    """With the master holding a topic's records SIGSTOPped (it accepts
    connections and answers nothing), locate_partitions, get_topic and
    list_subscriptions on a connected client each answer within a few
    seconds, well before the replica is promoted, as they did before."""
    with streamsub.blocking.connect(cluster.url) as client:
        placed = _place(cluster, client)
        assert placed.victim.process is not None
        os.kill(placed.victim.process.pid, signal.SIGSTOP)
        try:
            _check_records(client, placed)
            assert _role(cluster, placed.replica) == "slave"
        finally:
            os.kill(placed.victim.process.pid, signal.SIGCONT)
