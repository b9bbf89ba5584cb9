"""Publishing while one master is silent: SIGSTOPped, so the kernel still takes
its connections but nothing answers (a hung process, a host cut off without a
reset). Writes to it wait for a connection that never becomes usable, each try
bounded by the socket timeout (the handshake gets no answer); the question is
what the publishes to the other masters wait meanwhile. They must not wait for
the silent one: each master has its own writes (README, Redis Cluster,
Failover)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import streamsub
from streamsub._backends.redis._cluster import RedisClusterBackend
from streamsub.testing import redis_cluster
from tests.cluster._helpers import owner_port, partition_slot, publish_again_and_again
from tests.cluster.conftest import SLOW_NODE_TIMEOUT_MS

PARTITIONS = 6
SOCKET_TIMEOUT = 2.0
"""The client's socket timeout: what one try to reach the silent master holds
(the kernel takes the connection; the handshake waits for an answer)."""
HEALTHY_WITHIN = 1.0
"""Seconds a publish to a healthy master's partition may take: half the socket
timeout, with room for a loaded 2-core machine."""
SILENT_FOR = 8.0
"""Seconds of publishing with the master silent: past the first writes' reply
timeout (2 s) and the next writes' tries to reach it (each up to 2 s: the
kernel takes the connection, the handshake waits for an answer), and well
within the node timeout (15 s), past which the cluster would go down."""


def _keys_of(partition: int, count: int) -> list[str]:
    keys = (f"key-{i}" for i in range(1_000))
    return [k for k in keys if streamsub.fnv1a_32(k.encode()) % PARTITIONS == partition][:count]


@pytest.mark.timeout(60)
async def test_publishes_to_other_masters_do_not_wait_for_a_silent_one(
    tmp_path: Path,
) -> None:
    """Partition 0's master is SIGSTOPped for 8 s (no replicas, and a node
    timeout of 15 s: nothing takes over, and the cluster stays up). Four
    tasks keep publishing to partition 0 (each publish waits, then fails);
    meanwhile publishes to every partition on the other masters, one after
    the other under two keys each, return their ids within 1 s each. Before,
    every try to reach the silent master held the appender's routing lock for
    up to the socket timeout, and the other masters' writes waited behind it
    (a publish took 2.01 s, three times in a run)."""
    # A node timeout past the silence: the other masters do not mark it failed
    # (and, with no replica, the cluster down) while the test runs.
    with redis_cluster(
        tmp_path, replicas=0, extra_args=("--cluster-node-timeout", str(SLOW_NODE_TIMEOUT_MS))
    ) as cluster:
        backend = RedisClusterBackend(cluster.url, socket_timeout=SOCKET_TIMEOUT)
        async with streamsub.connect(backend=backend) as client:
            await client.create_topic("quiet", partitions=PARTITIONS)
            ports = {
                p: owner_port(cluster, partition_slot(cluster, "quiet", p))
                for p in range(PARTITIONS)
            }
            healthy = [p for p in range(PARTITIONS) if ports[p] != ports[0]]
            assert healthy, "every partition on one master"
            keys = {p: _keys_of(p, 4) for p in range(PARTITIONS)}  # worked out before the clock
            for p in range(PARTITIONS):  # every master's connection made first
                await client.publish("quiet", b"warm", ordering_key=keys[p][0])
            victim = next(s for s in cluster.servers if s.port == ports[0])
            assert victim.process is not None
            failures: list[str] = []

            os.kill(victim.process.pid, signal.SIGSTOP)
            try:
                stuck = [
                    asyncio.create_task(publish_again_and_again(client, "quiet", key, failures))
                    for key in keys[0]
                ]
                slow: list[tuple[int, float]] = []
                returned = 0
                until = time.monotonic() + SILENT_FOR
                n = 0
                while time.monotonic() < until:
                    for p in healthy:
                        for key in keys[p][:2]:
                            started = time.monotonic()
                            message_id = await client.publish("quiet", b"%d" % n, ordering_key=key)
                            took = time.monotonic() - started
                            assert message_id.startswith(f"{p}-")
                            returned += 1
                            if took > HEALTHY_WITHIN:
                                slow.append((p, round(took, 2)))
                    n += 1
                for task in stuck:
                    task.cancel()
                await asyncio.gather(*stuck, return_exceptions=True)
            finally:
                os.kill(victim.process.pid, signal.SIGCONT)
    assert not slow, (
        f"{len(slow)} of {returned} publishes to other masters waited for the silent one: "
        f"{slow[:6]}"
    )
    assert returned >= 20
    # What this is about: writes to the silent master waited to reach it (a
    # new connection), outside the lock, until their time was up.
    assert any("does not answer" in failure for failure in failures), failures[:3]
