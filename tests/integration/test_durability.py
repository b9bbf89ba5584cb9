"""Publish durability on one server: WAIT for replicas behind each batch."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer, redis_server

# Standalone: one server and its replica (a cluster's: tests/cluster/test_cluster_failover.py).
pytestmark = pytest.mark.standalone


async def test_a_publish_waits_for_a_replica_and_fails_without_one(
    server: RedisServer,
    client: streamsub.Client,
    redis_client: redis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
    redis_binary: str | None,
) -> None:
    """With Durability(replicas=1) and no replica, a publish raises
    UnavailableError after the timeout (the message is stored on the server
    all the same); once a replica follows, 1,000 messages over 4 partitions
    publish, and the replica holds them all when publish returns."""
    await client.create_topic("durable", partitions=4)
    streams = [f"ss:{{durable.{p}}}" for p in range(4)]
    impatient = streamsub.Durability(replicas=1, timeout=0.3)
    async with streamsub.connect(server.url, durability=impatient) as durable:
        with pytest.raises(streamsub.UnavailableError, match="only 0 of the 1 replicas"):
            await durable.publish("durable", b"unconfirmed")
    assert sum(redis_client.xlen(s) for s in streams) == 1
    with redis_server(
        tmp_path_factory.mktemp("replica"),
        binary=redis_binary,  # the same server as the primary (Redis, or Valkey)
        extra_args=("--replicaof", "127.0.0.1", str(server.port)),
    ) as replica:
        follower = redis.Redis(port=replica.port)
        try:
            deadline = time.monotonic() + 10
            while follower.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never linked"
                await asyncio.sleep(0.02)
            durability = streamsub.Durability(replicas=1)
            async with streamsub.connect(server.url, durability=durability) as durable:
                ids = await durable.publish_many("durable", [b"m%d" % i for i in range(1000)])
            held = sum(follower.xlen(s) for s in streams)
        finally:
            follower.close()
    assert len(set(ids)) == 1000
    assert held == 1001
