"""streamsub itself, through its public API only.

A topic ``bench`` with 16 partitions and a subscription ``bench-sub`` starting at
the earliest message, both created before the round. Publishing: ``publish_many``
in chunks of 1000 with up to 4 chunks in flight. Consuming: ``client.subscribe``
with a handler that returns normally (streamsub acks it when it returns) and
``FlowControl(max_messages=1000)``. Acks happen after the handler, out of our
sight, so the clock stops when the server shows no pending entry in any consumer
group (see :func:`~impls.base.wait_until_all_acked`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from redis.asyncio import Redis

import streamsub

from .base import ConsumeResult, Implementation, Receiver, padding, stamp, wait_until_all_acked

TOPIC = "bench"
SUBSCRIPTION = "bench-sub"
PARTITIONS = 16
PUBLISH_CHUNK = 1000
CHUNKS_IN_FLIGHT = 4
MAX_OUTSTANDING = 1000


class Streamsub(Implementation):
    name = "streamsub"
    ack_deadline = 30.0
    """The default: leases are extended every 10 s and idle entries swept every
    7.5 s, so during a round of a second neither runs more than at start."""

    async def setup(self) -> None:
        async with streamsub.connect(self.env.redis_url) as client:
            await client.create_topic(TOPIC, partitions=PARTITIONS)
            await client.create_subscription(
                SUBSCRIPTION, topic=TOPIC, start="earliest", ack_deadline=self.ack_deadline
            )

    async def publish(self, n: int, size: int) -> float:
        pad = padding(size)
        window = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

        async with streamsub.connect(self.env.redis_url) as client:

            async def publish_chunk(base: int) -> None:
                async with window:
                    # Stamp when the chunk is about to go, not when its task was made.
                    chunk = [
                        streamsub.OutgoingMessage(data=stamp(seq, pad))
                        for seq in range(base, min(base + PUBLISH_CHUNK, n))
                    ]
                    await client.publish_many(TOPIC, chunk)

            start = time.perf_counter()
            tasks = [
                asyncio.create_task(publish_chunk(base)) for base in range(0, n, PUBLISH_CHUNK)
            ]
            await asyncio.gather(*tasks)
            return time.perf_counter() - start

    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        receiver = Receiver(n)

        async def handler(message: streamsub.Message) -> None:
            receiver.on_message(message.data)

        flow_control = streamsub.FlowControl(max_messages=MAX_OUTSTANDING)
        watcher = Redis.from_url(self.env.redis_url)
        try:
            async with (
                streamsub.connect(self.env.redis_url) as client,
                client.subscribe(SUBSCRIPTION, handler, flow_control=flow_control),
            ):
                ready()
                await receiver.done.wait()
                last_ack_ns = await wait_until_all_acked(watcher)
        finally:
            await watcher.aclose()
        return receiver.result(last_ack_ns)


class StreamsubBusyLeases(Streamsub):
    """streamsub with a 1 s ack deadline: leases are extended every 0.33 s and idle
    entries swept every 0.25 s, so both run all through a round. Its ratio to
    ``streamsub`` is what lease extension and reclaim cost."""

    name = "streamsub-1s"
    ack_deadline = 1.0
