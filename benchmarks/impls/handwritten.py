"""The baseline: the simplest realistic redis-py asyncio loop a user would write.

One stream, one consumer group, one consumer. Publishing pipelines XADD in chunks
of 200 (``transaction=False``); consuming loops ``XREADGROUP COUNT 500 BLOCK 1000``
and sends one XACK per batch with all of the batch's ids. redis-py uses hiredis
for parsing when it is installed (it is, via ``redis[hiredis]``).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TypeAlias, cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .base import (
    ConsumeResult,
    Implementation,
    Receiver,
    SendBurst,
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

# XREADGROUP's reply in RESP2 (redis-py's default): [(stream, [(id, fields), ...])]
ReadReply: TypeAlias = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None


class Handwritten(Implementation):
    name = "handwritten"

    async def publish(self, n: int, size: int) -> float:
        return await self._pipelined(n, size, PUBLISH_CHUNK)

    async def _pipelined(self, n: int, size: int, chunk: int) -> float:
        pad = padding(size)
        client = Redis.from_url(self.env.redis_url)
        try:
            await client.ping()  # type: ignore[misc]  # redis-py 7 types it as maybe-sync
            start = time.perf_counter()
            for base in range(0, n, chunk):
                pipe = client.pipeline(transaction=False)
                for seq in range(base, min(base + chunk, n)):
                    pipe.xadd(STREAM, {FIELD: stamp(seq, pad)})
                await pipe.execute()
            return time.perf_counter() - start
        finally:
            await client.aclose()

    async def publish_each(self, n: int, size: int) -> tuple[float, array[int]]:
        """One ``XADD`` awaited at a time on one connection."""
        pad = padding(size)
        client = Redis.from_url(self.env.redis_url)
        try:
            return await each_in_turn(n, lambda seq: client.xadd(STREAM, {FIELD: stamp(seq, pad)}))
        finally:
            await client.aclose()

    async def publish_workers(self, n: int, size: int, workers: int) -> float:
        """Each worker awaits one ``XADD`` at a time; redis-py's pool gives each
        command in flight a connection of its own (up to ``workers``)."""
        pad = padding(size)
        client = Redis.from_url(self.env.redis_url)
        try:
            return await worker_pool(
                n, workers, lambda seq: client.xadd(STREAM, {FIELD: stamp(seq, pad)})
            )
        finally:
            await client.aclose()

    async def publish_calls(self, n: int, size: int, per_call: int) -> float:
        """The pipelined loop with ``per_call`` XADDs a pipeline."""
        return await self._pipelined(n, size, per_call)

    @asynccontextmanager
    async def open_sender(self) -> AsyncIterator[SendBurst]:
        """One ``XADD`` per message; a burst of several as one pipeline."""
        client = Redis.from_url(self.env.redis_url)

        async def send(burst: Sequence[tuple[int, bytes]]) -> object:
            if len(burst) == 1:
                return await client.xadd(STREAM, {FIELD: burst[0][1]})
            pipe = client.pipeline(transaction=False)
            for _seq, body in burst:
                pipe.xadd(STREAM, {FIELD: body})
            return await pipe.execute()

        try:
            await client.ping()  # type: ignore[misc]  # redis-py 7 types it as maybe-sync
            yield send
        finally:
            await client.aclose()

    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        client = Redis.from_url(self.env.redis_url)
        try:
            try:
                await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            ready()
            receiver = Receiver(n)
            while not receiver.complete:
                reply = cast(
                    "ReadReply",
                    await client.xreadgroup(
                        GROUP, CONSUMER, {STREAM: ">"}, count=READ_COUNT, block=BLOCK_MS
                    ),
                )
                for _stream, entries in reply or ():
                    ids = []
                    for entry_id, fields in entries:
                        receiver.on_message(fields[FIELD])
                        ids.append(entry_id)
                    await client.xack(STREAM, GROUP, *ids)
            return receiver.result(last_ack_ns=time.time_ns())
        finally:
            await client.aclose()
