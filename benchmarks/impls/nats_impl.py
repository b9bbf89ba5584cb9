"""NATS JetStream through nats-py: the non-redis peer.

A stream ``BENCH`` on subject ``bench.events`` (memory storage by default, to match
a redis-server that persists nothing; ``--nats-storage file`` for JetStream's
default). Publishing uses ``js.publish_async`` -- nats-py's pipelined publish,
which keeps up to 4000 un-acked publishes in flight -- and then waits for every
PubAck, so the elapsed time covers the server having stored every message.
Consuming: a durable pull consumer with explicit acks, ``fetch(500)`` in a loop
and ``msg.ack()`` for each message; a final flush makes sure the last acks have
reached the server before the clock stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import nats
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType
from nats.js.errors import NotFoundError

from .base import (
    ConsumeResult,
    Implementation,
    Receiver,
    SendBurst,
    calls_in_turn,
    each_in_turn,
    padding,
    stamp,
    worker_pool,
)

STREAM = "BENCH"
SUBJECT = "bench.events"
DURABLE = "bench-consumer"
FETCH_BATCH = 500
FETCH_TIMEOUT_S = 1.0


class Nats(Implementation):
    name = "nats"

    async def _connect(self) -> Client:
        if self.env.nats_url is None:
            msg = "no nats-server in this run"
            raise RuntimeError(msg)
        return await nats.connect(self.env.nats_url, allow_reconnect=False)

    async def reset(self) -> None:
        nc = await self._connect()
        try:
            with contextlib.suppress(NotFoundError):
                await nc.jetstream().delete_stream(STREAM)
        finally:
            await nc.close()

    async def setup(self) -> None:
        nc = await self._connect()
        try:
            storage = StorageType(self.env.nats_storage)
            await nc.jetstream().add_stream(name=STREAM, subjects=[SUBJECT], storage=storage)
        finally:
            await nc.close()

    async def stored_count(self) -> int:
        nc = await self._connect()
        try:
            info = await nc.jetstream().stream_info(STREAM)
            return info.state.messages
        finally:
            await nc.close()

    async def publish(self, n: int, size: int) -> float:
        pad = padding(size)
        nc = await self._connect()
        try:
            js = nc.jetstream()
            await nc.flush()
            start = time.perf_counter()
            acks = [await js.publish_async(SUBJECT, stamp(seq, pad)) for seq in range(n)]
            await asyncio.gather(*acks)  # raises if the server refused any message
            return time.perf_counter() - start
        finally:
            await nc.close()

    async def publish_each(self, n: int, size: int) -> tuple[float, array[int]]:
        """``js.publish`` (which waits for its PubAck) awaited one at a time."""
        pad = padding(size)
        nc = await self._connect()
        try:
            js = nc.jetstream()
            return await each_in_turn(n, lambda seq: js.publish(SUBJECT, stamp(seq, pad)))
        finally:
            await nc.close()

    async def publish_workers(self, n: int, size: int, workers: int) -> float:
        """``workers`` callers, each awaiting ``js.publish`` in a loop."""
        pad = padding(size)
        nc = await self._connect()
        try:
            js = nc.jetstream()
            return await worker_pool(n, workers, lambda seq: js.publish(SUBJECT, stamp(seq, pad)))
        finally:
            await nc.close()

    async def publish_calls(self, n: int, size: int, per_call: int) -> float:
        """``publish_async`` for ``per_call`` messages, then wait for their PubAcks;
        one call after the other."""
        pad = padding(size)
        nc = await self._connect()
        try:
            js = nc.jetstream()

            async def call(seqs: range) -> object:
                acks = [await js.publish_async(SUBJECT, stamp(seq, pad)) for seq in seqs]
                return await asyncio.gather(*acks)

            return await calls_in_turn(n, per_call, call)
        finally:
            await nc.close()

    @asynccontextmanager
    async def open_sender(self) -> AsyncIterator[SendBurst]:
        """``js.publish_async`` per message, then wait for the burst's PubAcks."""
        nc = await self._connect()
        js = nc.jetstream()

        async def send(burst: Sequence[tuple[int, bytes]]) -> object:
            acks = [await js.publish_async(SUBJECT, body) for _seq, body in burst]
            return await asyncio.gather(*acks)

        try:
            await nc.flush()
            yield send
        finally:
            await nc.close()

    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        nc = await self._connect()
        try:
            js = nc.jetstream()
            config = ConsumerConfig(
                durable_name=DURABLE,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
            )
            sub = await js.pull_subscribe(SUBJECT, durable=DURABLE, stream=STREAM, config=config)
            ready()
            receiver = Receiver(n)
            while not receiver.complete:
                try:
                    msgs = await sub.fetch(FETCH_BATCH, timeout=FETCH_TIMEOUT_S)
                except TimeoutError:  # nats-py raises asyncio's or its own subclass
                    continue
                for msg in msgs:
                    receiver.on_message(msg.data)
                    await msg.ack()
            await nc.flush()
            return receiver.result(last_ack_ns=time.time_ns())
        finally:
            await nc.close()
