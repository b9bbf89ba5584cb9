"""Shared helpers of the issue-9 review tests (real clusters only)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import streamsub
from streamsub._backends.redis import _keys
from streamsub._backends.redis._slots import key_slot
from streamsub.testing import ACL_RULE, RedisClusterServers


async def publish_again_and_again(
    client: streamsub.Client, topic: str, key: str, failures: list[str]
) -> None:
    """Publish under ``key`` until cancelled, as a client that retries would:
    the text of each UnavailableError goes to ``failures``, and a key paused
    by a failed publish is resumed."""
    while True:
        try:
            await client.publish(topic, b"again", ordering_key=key)
        except streamsub.UnavailableError as exc:
            failures.append(str(exc))
        except streamsub.OrderingKeyPausedError:
            client.resume_publish(topic, key)
        await asyncio.sleep(0.05)


def partition_tags(cluster: RedisClusterServers, topic: str) -> list[str]:
    """Each partition's hash tag, by the salts stored with the topic."""
    inspect = cluster.client()
    try:
        salts = [int(s) for s in inspect.hget(_keys.topic_key(topic), "salts").split()]
    finally:
        inspect.close()
    return [_keys.partition_tag(topic, p, salt) for p, salt in enumerate(salts)]


def partition_slot(cluster: RedisClusterServers, topic: str, partition: int) -> int:
    return key_slot(_keys.stream_key(partition_tags(cluster, topic)[partition]))


def owner_port(cluster: RedisClusterServers, slot: int) -> int:
    for port in cluster.master_ports():
        node = cluster.node(port)
        try:
            for first, last, (_host, p, *_), *_ in node.execute_command("CLUSTER", "SLOTS"):
                if first <= slot <= last:
                    return int(p)
        finally:
            node.close()
    raise AssertionError(f"no owner for slot {slot}")


@contextlib.contextmanager
def slot_held_migrating(
    cluster: RedisClusterServers, slot: int, only: Sequence[str] | None = None
) -> Iterator[tuple[int, int]]:
    """Put ``slot`` in MIGRATING (source) / IMPORTING (target) state and move
    all its keys to the target (or only the keys ``only`` names), as
    redis-cli --cluster reshard does between its MIGRATE calls and its final
    SETSLOT NODE; hold it so while the block runs, then finish the move (the
    keys left, then SETSLOT NODE everywhere)."""
    source_port = owner_port(cluster, slot)
    masters = cluster.master_ports()
    target_port = next(p for p in masters if p != source_port)
    source, target = cluster.node(source_port), cluster.node(target_port)
    others = [cluster.node(p) for p in masters if p not in (source_port, target_port)]
    try:
        target_id = target.execute_command("CLUSTER", "MYID").decode()
        source_id = source.execute_command("CLUSTER", "MYID").decode()
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)

        def migrate(names: Sequence[Any]) -> None:
            source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *names)

        if only is not None:
            migrate(only)
        else:
            while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                migrate(keys)
        try:
            yield source_port, target_port
        finally:
            while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                migrate(keys)
            for node in (target, source, *others):
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    finally:
        for node in (source, target, *others):
            node.close()


def emptied(cluster: RedisClusterServers) -> None:
    inspect = cluster.client()
    try:
        inspect.flushall()
    finally:
        inspect.close()


async def warm_pool(backend: Any, port: int, n: int = 4) -> None:
    """Leave ``n`` free pooled connections to the node at ``port`` in the
    client's redis-py cluster client (as a busy client has)."""
    import asyncio

    redis = backend._redis
    await redis.initialize()
    node = redis.get_node(host="127.0.0.1", port=port)
    await asyncio.gather(
        *(redis.execute_command("WAIT", 5, 50, target_nodes=node) for _ in range(n))
    )


class Strike(NamedTuple):
    """What a failover did, and when (``time.monotonic()``)."""

    old: int
    """The struck master's port."""
    new: int
    """The port of the replica that took over its slots."""
    started: float
    """When the master was struck (SIGKILL sent, CLUSTER FAILOVER asked)."""
    promoted: float
    """When the replica said it is a master."""
    whole: float
    """When every running node agreed on the new layout (after a SIGKILL, unless
    told not to restart it: with the killed master started again and in sync as
    the new master's replica)."""


def replica_port(cluster: RedisClusterServers, master: int) -> int:
    """The port of a replica of the master at port ``master``."""
    for port in cluster.ports:
        node = cluster.node(port)
        try:
            info = node.info("replication")
        finally:
            node.close()
        if info.get("role") == "slave" and int(info["master_port"]) == master:
            return port
    raise AssertionError(f"the master on port {master} has no replica")


def _replica_of(cluster: RedisClusterServers, slot: int) -> tuple[int, int]:
    """(master port, its replica's port) of ``slot``."""
    inspect = cluster.client()
    try:
        old = inspect.nodes_manager.get_node_from_slot(slot).port
    finally:
        inspect.close()
    return old, replica_port(cluster, old)


def _wait_promoted(cluster: RedisClusterServers, port: int, started: float) -> float:
    node = cluster.node(port)
    try:
        while node.info("replication").get("role") != "master":
            assert time.monotonic() - started < 30, f"the replica on port {port} never took over"
            time.sleep(0.02)
    finally:
        node.close()
    return time.monotonic()


def failover(cluster: RedisClusterServers, slot: int) -> Strike:
    """CLUSTER FAILOVER on the replica of ``slot``'s master; wait until the
    cluster agrees."""
    old, new = _replica_of(cluster, slot)
    node = cluster.node(new)
    try:
        started = time.monotonic()
        node.execute_command("CLUSTER", "FAILOVER")
    finally:
        node.close()
    promoted = _wait_promoted(cluster, new, started)
    cluster.wait_ready()
    return Strike(old, new, started, promoted, time.monotonic())


def kill_master(cluster: RedisClusterServers, slot: int, *, restart: bool = True) -> Strike:
    """SIGKILL ``slot``'s master; once its replica took over, start the killed
    one again (it comes back as a replica, so Durability(replicas=1) can be met
    again; with ``restart=False`` it stays down) and wait until every running
    node agrees."""
    old, new = _replica_of(cluster, slot)
    server = next(s for s in cluster.servers if s.port == old)
    started = time.monotonic()
    server.kill()
    promoted = _wait_promoted(cluster, new, started)
    if restart:
        server.start()
    cluster.wait_ready()
    return Strike(old, new, started, promoted, time.monotonic())


def assert_nothing_pending(cluster: RedisClusterServers, tags: Sequence[str], group: str) -> None:
    """No partition (by its hash tag) has an entry pending in ``group``."""
    inspect = cluster.client()
    try:
        for tag in tags:
            assert inspect.xpending(_keys.stream_key(tag), group)["pending"] == 0, tag
    finally:
        inspect.close()


def as_acl_user(cluster: RedisClusterServers, name: str, password: str) -> str:
    """Create ``name`` with exactly ACL_RULE on every node; the cluster's URL as it."""
    for port in cluster.ports:
        node = cluster.node(port)
        try:
            node.execute_command(
                "ACL", "SETUSER", name, "reset", "on", f">{password}", *ACL_RULE.split()
            )
        finally:
            node.close()
    scheme, rest = cluster.url.split("://", 1)
    return f"{scheme}://{name}:{password}@{rest}"
