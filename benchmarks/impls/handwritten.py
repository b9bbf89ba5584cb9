"""The baseline: the simplest realistic redis-py asyncio loop a user would write.

One stream, one consumer group, one consumer. Publishing pipelines XADD in chunks
of 200 (``transaction=False``); consuming loops ``XREADGROUP COUNT 500 BLOCK 1000``
and sends one XACK per batch with all of the batch's ids. redis-py uses hiredis
for parsing when it is installed (it is, via ``redis[hiredis]``).

On a Redis Cluster (:class:`HandwrittenCluster`) one stream would live on one
master, so the loop spreads its messages over 16 streams instead, as streamsub
spreads a topic's 16 partitions: message ``seq`` goes to stream ``seq % 16``,
the streams' names chosen so that the masters hold 6, 5 and 5 of them (as
streamsub's partitions are placed). ``redis.asyncio.RedisCluster`` routes each
``XADD`` to its stream's master; a pipeline is split by node and the nodes'
parts are sent concurrently. The consumer runs one reader per stream: a
blocking ``XREADGROUP COUNT 500 BLOCK 1000`` sent to the stream's master
(``target_nodes``: without it redis-py asks a node ``COMMAND GETKEYS`` before
every ``XREADGROUP``, whose keys it cannot find by itself), then one ``XACK``
per batch; each reader holds a connection of its own while it blocks.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from .base import (
    ConsumeResult,
    Implementation,
    Receiver,
    SendBurst,
    calls_in_turn,
    cluster_nodes,
    each_in_turn,
    padding,
    stamp,
    worker_pool,
)

STREAM = "bench"
GROUP = "bench-group"
CONSUMER = "consumer-1"
FIELD = b"d"
PUBLISH_CHUNK = 200
READ_COUNT = 500
BLOCK_MS = 1000
CLUSTER_STREAMS = 16
"""Streams on a cluster: as many as streamsub's topic has partitions."""

# XREADGROUP's reply in RESP2 (redis-py's default): [(stream, [(id, fields), ...])]
ReadReply: TypeAlias = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None
Client: TypeAlias = Any
"""``Redis`` or ``RedisCluster``: the calls used here are the same on both."""


class Handwritten(Implementation):
    name = "handwritten"

    @classmethod
    def cluster_variant(cls) -> type[Implementation] | None:
        return HandwrittenCluster

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[tuple[Client, list[str]]]:
        """A connected client, and the streams to publish to (message ``seq`` to
        ``streams[seq % len(streams)]``) and read from."""
        client = Redis.from_url(self.env.redis_url)
        try:
            await client.ping()  # type: ignore[misc]  # redis-py 7 types it as maybe-sync
            yield client, [STREAM]
        finally:
            await client.aclose()

    async def read(self, client: Client, stream: str) -> ReadReply:
        """One blocking ``XREADGROUP`` of ``stream``."""
        return await read_group(client, GROUP, CONSUMER, stream)

    async def publish(self, n: int, size: int) -> float:
        return await self._pipelined(n, size, PUBLISH_CHUNK)

    async def _pipelined(self, n: int, size: int, chunk: int) -> float:
        pad = padding(size)
        async with self.connection() as (client, streams):
            start = time.perf_counter()
            for base in range(0, n, chunk):
                pipe = client.pipeline(transaction=False)
                for seq in range(base, min(base + chunk, n)):
                    pipe.xadd(streams[seq % len(streams)], {FIELD: stamp(seq, pad)})
                await pipe.execute()
            return time.perf_counter() - start

    async def publish_each(self, n: int, size: int) -> tuple[float, array[int]]:
        """One ``XADD`` awaited at a time on one connection (per node)."""
        pad = padding(size)
        async with self.connection() as (client, streams):
            return await each_in_turn(
                n, lambda seq: client.xadd(streams[seq % len(streams)], {FIELD: stamp(seq, pad)})
            )

    async def publish_workers(self, n: int, size: int, workers: int) -> float:
        """Each worker awaits one ``XADD`` at a time; redis-py's pool gives each
        command in flight a connection of its own (up to ``workers``)."""
        pad = padding(size)
        async with self.connection() as (client, streams):
            return await worker_pool(
                n,
                workers,
                lambda seq: client.xadd(streams[seq % len(streams)], {FIELD: stamp(seq, pad)}),
            )

    async def publish_calls(self, n: int, size: int, per_call: int) -> float:
        """The pipelined loop with ``per_call`` XADDs a pipeline."""
        pad = padding(size)
        async with self.connection() as (client, streams):

            async def call(seqs: range) -> object:
                pipe = client.pipeline(transaction=False)
                for seq in seqs:
                    pipe.xadd(streams[seq % len(streams)], {FIELD: stamp(seq, pad)})
                return await pipe.execute()

            return await calls_in_turn(n, per_call, call)

    @asynccontextmanager
    async def open_sender(self) -> AsyncIterator[SendBurst]:
        """One ``XADD`` per message; a burst of several as one pipeline."""
        async with self.connection() as (client, streams):

            async def send(burst: Sequence[tuple[int, bytes]]) -> object:
                if len(burst) == 1:
                    seq, body = burst[0]
                    return await client.xadd(streams[seq % len(streams)], {FIELD: body})
                pipe = client.pipeline(transaction=False)
                for seq, body in burst:
                    pipe.xadd(streams[seq % len(streams)], {FIELD: body})
                return await pipe.execute()

            yield send

    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        """One reader per stream (one in all on a single server); the clock stops
        at the ack of the batch that completes the count."""
        async with self.connection() as (client, streams):
            for stream in streams:
                try:
                    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
            ready()
            receiver = Receiver(n)

            async def reader(stream: str) -> int:
                """Read and ack ``stream`` until a batch of it completes the count."""
                while True:
                    for _stream, entries in await self.read(client, stream) or ():
                        was_complete = receiver.complete
                        ids = []
                        for entry_id, fields in entries:
                            receiver.on_message(fields[FIELD])
                            ids.append(entry_id)
                        completes = receiver.complete and not was_complete  # this batch did
                        await client.xack(stream, GROUP, *ids)
                        if completes:
                            return time.time_ns()

            readers = [asyncio.create_task(reader(stream)) for stream in streams]
            try:
                done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
                last_ack_ns = done.pop().result()
            finally:
                for task in readers:
                    task.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
            return receiver.result(last_ack_ns)


class HandwrittenCluster(Handwritten):
    """The hand-written loop on a Redis Cluster: 16 streams spread evenly over the
    masters, ``RedisCluster`` (see the module's docstring)."""

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[tuple[Client, list[str]]]:
        client = RedisCluster(startup_nodes=cluster_nodes(self.env.redis_url))
        try:
            await client.initialize()
            # Every master's connection open before any clock starts, as the
            # one-server loop's PING opens its one.
            await client.ping(target_nodes=RedisCluster.PRIMARIES)  # type: ignore[misc]
            yield client, spread_streams(client, CLUSTER_STREAMS)
        finally:
            await client.aclose()


async def read_group(client: Client, group: str, consumer: str, stream: str) -> ReadReply:
    """One blocking ``XREADGROUP COUNT 500 BLOCK 1000`` of ``stream`` for ``group``;
    on a cluster sent to the stream's master (``target_nodes``: without it
    redis-py asks a node ``COMMAND GETKEYS`` first, see the module's docstring)."""
    if isinstance(client, RedisCluster):
        return cast(
            "ReadReply",
            await client.execute_command(
                "XREADGROUP", "GROUP", group, consumer, "COUNT", READ_COUNT, "BLOCK", BLOCK_MS,
                "STREAMS", stream, ">",
                target_nodes=client.get_node_from_key(stream),
            ),
        )  # fmt: skip
    return cast(
        "ReadReply",
        await client.xreadgroup(group, consumer, {stream: ">"}, count=READ_COUNT, block=BLOCK_MS),
    )


def spread_streams(cluster: RedisCluster, count: int, prefix: str = STREAM) -> list[str]:
    """``count`` stream names, stream ``i`` on master ``i % masters`` (masters by
    name): ``<prefix>.<i>``, or ``<prefix>.<i>|<salt>`` with the smallest salt
    that lands there. The same names in every process, given the same slot map."""
    masters = sorted(cluster.get_primaries(), key=lambda node: node.name)
    streams = []
    for i in range(count):
        target, salt, name = masters[i % len(masters)], 0, f"{prefix}.{i}"
        while cluster.get_node_from_key(name) != target:
            salt += 1
            name = f"{prefix}.{i}|{salt}"
        streams.append(name)
    return streams
