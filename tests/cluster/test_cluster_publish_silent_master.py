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
from typing import Any

import pytest

import streamsub
from streamsub._backends.redis import _cluster, _keys
from streamsub._backends.redis._cluster import RedisClusterBackend
from streamsub._backends.redis._in_order import InOrderConnection, NotReady
from streamsub.testing import RedisClusterServers, redis_cluster
from tests._wait import until
from tests.cluster._helpers import (
    owner_port,
    partition_slot,
    partition_tags,
    publish_again_and_again,
)
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
@pytest.mark.parametrize("connections", ["reconnect", "idle"])
async def test_publishes_to_other_masters_do_not_wait_for_a_silent_one(
    tmp_path: Path, connections: str
) -> None:
    """Partition 0's master is SIGSTOPped for 8 s (no replicas, and a node
    timeout of 15 s: nothing takes over, and the cluster stays up). Four
    tasks keep publishing to partition 0 (each publish waits, then fails);
    meanwhile publishes to every partition on the other masters, one after
    the other under two keys each, return their ids within 1 s each. Before,
    every try to reach the silent master held the appender's routing lock for
    up to the socket timeout, and the other masters' writes waited behind it
    (a publish took 2.01 s, three times in a run).

    ``idle``: the appender's connections count as idle after 0.2 s (30 s in
    use), so the first writes to the silent master PING its idle connection
    (the PING waits out the socket timeout, which held the lock too) before
    later ones connect anew, and a healthy master's connection left idle
    that long is PINGed before its next write."""
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
            if connections == "idle":
                made = backend._appender._connections
                assert len(made) == 3
                for connection in made.values():
                    connection._health_check_interval = 0.2
                await asyncio.sleep(0.3)
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


async def test_writes_found_not_ready_under_the_lock_go_back_at_once(
    emptied: RedisClusterServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes whose connection the check made ready, and which then waited for
    the routing lock until it was idle again, raise NotReady under the lock and
    go back to the check at once: their masters answer, so they take none of
    the pauses meant for a master that refuses connections or does not answer
    (50 ms, doubling up to 1 s). Three
    publishes under each of two keys of every partition, on all three masters;
    each is stored once, and in order."""
    not_ready: set[int] = set()  # the connections that raised it
    send_many = InOrderConnection.send_many

    async def counting(self: InOrderConnection, *args: Any, **kwargs: Any) -> Any:
        try:
            return await send_many(self, *args, **kwargs)
        except NotReady:
            not_ready.add(id(self))
            raise

    pauses: list[float] = []
    first_set = _cluster._first_set

    async def recording(events: set[asyncio.Event], timeout: float | None) -> None:
        if timeout is not None:
            pauses.append(timeout)
        await first_set(events, timeout)

    monkeypatch.setattr(InOrderConnection, "send_many", counting)
    monkeypatch.setattr(_cluster, "_first_set", recording)
    backend = RedisClusterBackend(emptied.url, socket_timeout=SOCKET_TIMEOUT)
    async with streamsub.connect(backend=backend) as client:
        await client.create_topic("idle", partitions=PARTITIONS)
        keys = {p: _keys_of(p, 2) for p in range(PARTITIONS)}
        for p in range(PARTITIONS):  # every master's connection made first
            await client.publish("idle", b"warm", ordering_key=keys[p][0])
        appender = backend._appender
        connections = list(appender._connections.values())
        assert len(connections) == 3
        for connection in connections:
            connection._health_check_interval = 0.2
        await asyncio.sleep(0.3)  # every connection idle: the check PINGs them

        async with appender._lock:
            checked = asyncio.get_running_loop().time()
            publishes = [
                asyncio.create_task(client.publish("idle", f"{key}:{n}".encode(), ordering_key=key))
                for n in range(3)
                for p in range(PARTITIONS)
                for key in keys[p]
            ]
            # Checked (each connection PINGed), queued at the lock, and idle again.
            await until(lambda: all(c._last_used > checked for c in connections), 10, "three PINGs")
            await asyncio.sleep(0.3)
        ids = await asyncio.gather(*publishes)

    assert len(set(ids)) == len(publishes)
    assert len(not_ready) == 3, "the premise: every master's writes found it idle again"
    assert pauses == [], "a write whose master answered paused as for one that does not"
    inspect = emptied.client()
    try:
        for p, tag in enumerate(partition_tags(emptied, "idle")):
            bodies = [
                fields[b"d"].decode()
                for _, fields in inspect.xrange(_keys.stream_key(tag))
                if fields[b"d"] != b"warm"
            ]
            assert sorted(bodies) == sorted(f"{key}:{n}" for n in range(3) for key in keys[p])
            for key in keys[p]:  # each key's in the order published
                assert [b for b in bodies if b.startswith(f"{key}:")] == [
                    f"{key}:{n}" for n in range(3)
                ]
    finally:
        inspect.close()
