"""streamsub itself, through its public API only.

A topic ``bench`` with 16 partitions and a subscription ``bench-sub`` starting at
the earliest message, both created before the round. Publishing: ``publish_many``
in chunks of 1000 with up to 4 chunks in flight. Consuming: ``client.subscribe``
with a handler that returns normally (streamsub acks it when it returns) and
``FlowControl(max_messages=1000)``. Acks happen after the handler, out of our
sight, so the clock stops when the server shows no pending entry in any consumer
group (see :func:`~impls.base.wait_until_all_acked`).

``streamsub-1s`` is the same with a 1 s ack deadline, ``streamsub-def`` the same
with a plain ``def`` handler (streamsub's thread pool), and ``streamsub-0.1``
(``impls/streamsub_prev.py``) the same running the previous release. ``streamsub``
is imported lazily (:meth:`Streamsub.lib`) so that the last can choose which one.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .base import (
    ConsumeResult,
    Implementation,
    Receiver,
    SendBurst,
    ThreadSafeReceiver,
    calls_in_turn,
    each_in_turn,
    padding,
    redis_nodes,
    stamp,
    wait_until_all_acked,
    worker_pool,
)

if TYPE_CHECKING:
    import streamsub

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

    @classmethod
    def cluster_variant(cls) -> type[Implementation] | None:
        """The same: ``streamsub.connect`` takes the cluster's ``redis+cluster://`` URL."""
        return cls

    def lib(self) -> ModuleType:
        """The ``streamsub`` package under test, imported on first use -- not when
        this module is imported, which happens in every spawned child as it
        unpickles the implementation, before ``streamsub-0.1`` can put the old
        code first on ``sys.path`` (see ``impls/streamsub_prev.py``)."""
        import streamsub

        return streamsub

    async def setup(self) -> None:
        streamsub = self.lib()
        async with streamsub.connect(self.env.redis_url) as client:
            await client.create_topic(TOPIC, partitions=PARTITIONS)
            await client.create_subscription(
                SUBSCRIPTION, topic=TOPIC, start="earliest", ack_deadline=self.ack_deadline
            )

    async def publish(self, n: int, size: int) -> float:
        streamsub = self.lib()
        pad = padding(size)
        window = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

        async with streamsub.connect(self.env.redis_url) as client:

            async def publish_chunk(base: int) -> None:
                async with window:
                    # Stamp when the chunk is about to go, not when its task was made.
                    chunk = [
                        streamsub.OutgoingMessage(
                            data=stamp(seq, pad), ordering_key=self.ordering_key(seq)
                        )
                        for seq in range(base, min(base + PUBLISH_CHUNK, n))
                    ]
                    await client.publish_many(TOPIC, chunk)

            start = time.perf_counter()
            tasks = [
                asyncio.create_task(publish_chunk(base)) for base in range(0, n, PUBLISH_CHUNK)
            ]
            await asyncio.gather(*tasks)
            return time.perf_counter() - start

    async def publish_each(self, n: int, size: int) -> tuple[float, array[int]]:
        """``publish()`` awaited one at a time (default BatchSettings)."""
        pad = padding(size)
        async with self.lib().connect(self.env.redis_url) as client:
            return await each_in_turn(
                n,
                lambda seq: client.publish(
                    TOPIC, stamp(seq, pad), ordering_key=self.ordering_key(seq)
                ),
            )

    async def publish_workers(self, n: int, size: int, workers: int) -> float:
        """``workers`` callers, each awaiting ``publish()`` in a loop."""
        pad = padding(size)
        async with self.lib().connect(self.env.redis_url) as client:
            return await worker_pool(
                n,
                workers,
                lambda seq: client.publish(
                    TOPIC, stamp(seq, pad), ordering_key=self.ordering_key(seq)
                ),
            )

    async def publish_calls(self, n: int, size: int, per_call: int) -> float:
        """``publish_many`` of ``per_call`` messages, awaited one call after the other."""
        streamsub = self.lib()
        pad = padding(size)
        async with streamsub.connect(self.env.redis_url) as client:

            async def call(seqs: range) -> object:
                chunk = [
                    streamsub.OutgoingMessage(
                        data=stamp(seq, pad), ordering_key=self.ordering_key(seq)
                    )
                    for seq in seqs
                ]
                return await client.publish_many(TOPIC, chunk)

            return await calls_in_turn(n, per_call, call)

    @asynccontextmanager
    async def open_sender(self) -> AsyncIterator[SendBurst]:
        """``publish()`` per message (default BatchSettings), a burst's calls
        concurrent, as independent callers' would be."""
        async with self.lib().connect(self.env.redis_url) as client:

            async def send(burst: Sequence[tuple[int, bytes]]) -> object:
                if len(burst) == 1:
                    seq, body = burst[0]
                    return await client.publish(TOPIC, body, ordering_key=self.ordering_key(seq))
                return await asyncio.gather(
                    *(
                        client.publish(TOPIC, body, ordering_key=self.ordering_key(seq))
                        for seq, body in burst
                    )
                )

            yield send

    def ordering_key(self, seq: int) -> str | None:
        """The ordering key of message ``seq``: none."""
        return None

    def make_handler(self, n: int) -> tuple[Receiver, Callable[[Any], Any]]:
        """The receiver and the handler that feeds it: ``async def``, as most users write."""
        receiver = Receiver(n)

        async def handler(message: streamsub.Message) -> None:
            receiver.on_message(message.data)

        return receiver, handler

    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        streamsub = self.lib()
        receiver, handler = self.make_handler(n)
        flow_control = streamsub.FlowControl(max_messages=MAX_OUTSTANDING)
        async with (
            redis_nodes(self.env.redis_url) as watchers,
            streamsub.connect(self.env.redis_url) as client,
            client.subscribe(SUBSCRIPTION, handler, flow_control=flow_control),
        ):
            ready()
            await receiver.done.wait()
            last_ack_ns = await wait_until_all_acked(*watchers)
        return receiver.result(last_ack_ns)


class StreamsubBusyLeases(Streamsub):
    """streamsub with a 1 s ack deadline: leases are extended every 0.33 s and idle
    entries swept every 0.25 s, so both run all through a round. Its ratio to
    ``streamsub`` is what lease extension and reclaim cost."""

    name = "streamsub-1s"
    ack_deadline = 1.0


class StreamsubDef(Streamsub):
    """streamsub with a plain ``def`` handler, which streamsub runs in its thread
    pool (default ``min(32, cpus + 4)`` threads). The handler holds a lock while
    it records the message -- the counters are shared across the pool's threads,
    as a real handler's state would be -- and the receiver wakes the event loop
    thread-safely when the last one arrives. Its ratio to ``streamsub`` is what a
    sync handler costs."""

    name = "streamsub-def"

    def make_handler(self, n: int) -> tuple[Receiver, Callable[[Any], Any]]:
        receiver = ThreadSafeReceiver(n)

        def handler(message: streamsub.Message) -> None:
            receiver.on_message(message.data)

        return receiver, handler


KEYS = 200
"""Ordering keys of the keyed rounds: many keys, as users have (customers, orders)."""
SUBSCRIBERS = 4


class StreamsubKeyed(Streamsub):
    """streamsub with every message under one of 200 ordering keys and four
    subscribers (four clients in the consuming process) on an unordered
    subscription: any subscriber reads any partition and a key's messages run
    side by side. The baseline of ``streamsub-ordered``."""

    name = "streamsub-4sub"
    ordered = False

    async def setup(self) -> None:
        streamsub = self.lib()
        async with streamsub.connect(self.env.redis_url) as client:
            await client.create_topic(TOPIC, partitions=PARTITIONS)
            await client.create_subscription(
                SUBSCRIPTION,
                topic=TOPIC,
                start="earliest",
                ack_deadline=self.ack_deadline,
                enable_message_ordering=self.ordered,
            )

    def ordering_key(self, seq: int) -> str | None:
        return f"customer-{seq % KEYS}"

    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        streamsub = self.lib()
        receiver, handler = self.make_handler(n)
        flow_control = streamsub.FlowControl(max_messages=MAX_OUTSTANDING)
        clients = [streamsub.connect(self.env.redis_url) for _ in range(SUBSCRIBERS)]
        subscribers = [
            client.subscribe(SUBSCRIPTION, handler, flow_control=flow_control) for client in clients
        ]
        async with redis_nodes(self.env.redis_url) as watchers:
            try:
                for subscriber in subscribers:
                    await subscriber.__aenter__()
                if self.ordered:
                    await settled(subscribers)
                ready()
                await receiver.done.wait()
                last_ack_ns = await wait_until_all_acked(*watchers)
            finally:
                for subscriber in subscribers:
                    await subscriber.__aexit__(None, None, None)
                for client in clients:
                    await client.aclose()
        return receiver.result(last_ack_ns)


OWNERSHIP_SETTLES = 30.0
"""Seconds the ordered subscribers may take to share the partitions out."""


async def settled(subscribers: Sequence[streamsub.Subscriber]) -> None:
    """Wait until the ordered ``subscribers`` read their even shares of the
    partitions. The first to start owns them all; the others get theirs by
    cooperative hand-over once its next heartbeat (within a third of the
    ownership lease, 3.3 s) sees them, and messages of a partition on the move
    wait for the move (correct: a key's next message must not overtake the one
    its old owner holds). A user's subscribers start once and stay; a round
    that began publishing before this would measure a one-off start-up, not
    steady-state latency or throughput."""
    share = PARTITIONS // len(subscribers)
    deadline = time.monotonic() + OWNERSHIP_SETTLES
    while any(len(s.statistics().partitions) != share for s in subscribers):
        if time.monotonic() > deadline:
            owned = [s.statistics().partitions for s in subscribers]
            msg = f"ordered subscribers did not share the partitions out: {owned}"
            raise RuntimeError(msg)
        await asyncio.sleep(0.01)


class StreamsubOrdered(StreamsubKeyed):
    """``streamsub-4sub`` on an ordered subscription: each partition owned by one
    of the four subscribers, a key's messages one at a time in publish order.
    Its ratio to ``streamsub-4sub`` is what ordering costs."""

    name = "streamsub-ordered"
    ordered = True
