"""FastStream's Redis broker (0.7.x) on a Redis stream with a consumer group.

Subscriber: ``@broker.subscriber(stream=StreamSub(stream, group=..., consumer=...,
max_records=500))`` with a plain ``async def handle(body: bytes)`` handler and the
default ack policy (``REJECT_ON_ERROR``: FastStream XACKs each message after its
handler returns). FastStream creates the group itself, at ``$``, when the
subscriber starts -- so the consumer must be running before anything is published
(the harness guarantees that). ``max_records=500`` mirrors the baseline's COUNT;
FastStream's default (None) reads everything available.

Publisher: ``broker.publish(body, stream=...)`` through a redis pipeline
(``transaction=False``) of 200 messages, like the baseline, so both pay one round
trip per 200 messages and the comparison measures the library, not the network.

The broker is created with ``logger=None``: at the default INFO level FastStream
writes two log lines per message ("Received", "Processed") to stdout, which would
flood the report and, on a slow terminal, slow the consumer down.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from faststream.redis import RedisBroker, StreamSub

from .base import (
    ConsumeResult,
    Implementation,
    Receiver,
    SendBurst,
    calls_in_turn,
    each_in_turn,
    padding,
    stamp,
    wait_until_all_acked,
    worker_pool,
)

STREAM = "bench"
GROUP = "bench-group"
CONSUMER = "consumer-1"
PUBLISH_CHUNK = 200
READ_COUNT = 500


def make_broker(url: str) -> RedisBroker:
    # logger=None is FastStream's documented way to turn logging off, but the
    # parameter is annotated LoggerProto, so type checkers reject it.
    return RedisBroker(url, logger=None)  # type: ignore[arg-type]


class FastStream(Implementation):
    name = "faststream"

    async def publish(self, n: int, size: int) -> float:
        return await self._pipelined(n, size, PUBLISH_CHUNK)

    async def publish_each(self, n: int, size: int) -> tuple[float, array[int]]:
        """``broker.publish`` awaited one at a time."""
        pad = padding(size)
        async with make_broker(self.env.redis_url) as broker:
            await broker.connect()
            return await each_in_turn(n, lambda seq: broker.publish(stamp(seq, pad), stream=STREAM))

    async def publish_workers(self, n: int, size: int, workers: int) -> float:
        """``workers`` callers, each awaiting ``broker.publish`` in a loop."""
        pad = padding(size)
        async with make_broker(self.env.redis_url) as broker:
            await broker.connect()
            return await worker_pool(
                n, workers, lambda seq: broker.publish(stamp(seq, pad), stream=STREAM)
            )

    async def publish_calls(self, n: int, size: int, per_call: int) -> float:
        """``broker.publish`` into a pipeline executed every ``per_call`` messages."""
        pad = padding(size)
        async with make_broker(self.env.redis_url) as broker:
            client = await broker.connect()

            async def call(seqs: range) -> object:
                async with client.pipeline(transaction=False) as pipe:
                    for seq in seqs:
                        await broker.publish(stamp(seq, pad), stream=STREAM, pipeline=pipe)
                    return await pipe.execute()

            return await calls_in_turn(n, per_call, call)

    async def _pipelined(self, n: int, size: int, chunk: int) -> float:
        pad = padding(size)
        async with make_broker(self.env.redis_url) as broker:
            client = await broker.connect()
            await client.ping()  # type: ignore[misc]  # redis-py 7 types it as maybe-sync
            start = time.perf_counter()
            for base in range(0, n, chunk):
                async with client.pipeline(transaction=False) as pipe:
                    for seq in range(base, min(base + chunk, n)):
                        await broker.publish(stamp(seq, pad), stream=STREAM, pipeline=pipe)
                    await pipe.execute()
            return time.perf_counter() - start

    @asynccontextmanager
    async def open_sender(self) -> AsyncIterator[SendBurst]:
        """``broker.publish`` per message; a burst of several into one pipeline."""
        async with make_broker(self.env.redis_url) as broker:
            client = await broker.connect()

            async def send(burst: Sequence[tuple[int, bytes]]) -> object:
                if len(burst) == 1:
                    return await broker.publish(burst[0][1], stream=STREAM)
                async with client.pipeline(transaction=False) as pipe:
                    for _seq, body in burst:
                        await broker.publish(body, stream=STREAM, pipeline=pipe)
                    return await pipe.execute()

            await client.ping()  # type: ignore[misc]  # redis-py 7 types it as maybe-sync
            yield send

    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        receiver = Receiver(n)
        broker = make_broker(self.env.redis_url)

        @broker.subscriber(
            stream=StreamSub(STREAM, group=GROUP, consumer=CONSUMER, max_records=READ_COUNT)
        )
        async def handle(body: bytes) -> None:
            receiver.on_message(body)

        await broker.start()  # creates the group (at "$") and starts reading
        try:
            ready()
            await receiver.done.wait()
            # FastStream acks after the handler returns, so the last ack is still in
            # flight when the last handler has run: watch the server for it.
            last_ack_ns = await wait_until_all_acked(await broker.connect())
        finally:
            await asyncio.wait_for(broker.stop(), timeout=30)
        return receiver.result(last_ack_ns)
