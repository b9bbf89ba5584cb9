"""PublishFlowControl against a real server: BLOCK bounds what is outstanding and keeps
each key's order, ERROR refuses whole calls at once, IGNORE does not bound.

Where messages must stay outstanding, the backend is a real RedisBackend whose
appends wait at a gate: a server gone slow, Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Mapping

import pytest
import redis

import streamsub
from streamsub._backends.base import Link, TopicRecord
from streamsub._errors import StreamsubError
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key
from tests._wait import until

BLOCK = streamsub.LimitExceededBehavior.BLOCK
ERROR = streamsub.LimitExceededBehavior.ERROR
IGNORE = streamsub.LimitExceededBehavior.IGNORE


class _Gated(TEST_BACKEND):
    """Appends wait until the gate opens."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = asyncio.Event()

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        await self.gate.wait()
        return await super().append(topic, batch, links)


def _stored(redis_client: redis.Redis, topic: str, partitions: int) -> list[tuple[str, bytes]]:
    """(ordering key, data) of every stored message, partition by partition."""
    return [
        (fields.get(b"k", b"").decode(), fields[b"d"])
        for p in range(partitions)
        for _, fields in redis_client.xrange(stream_key(redis_client, topic, p))
    ]


async def test_block_never_has_more_than_the_limit_outstanding_and_keeps_key_order(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Forty concurrent publishers (each making bursts of calls at once) over three
    topics, three keys per topic and keyless messages,
    against a 40-message, 4 KiB limit shared by the client: sampled outstanding never
    passes either limit, publishers did wait, and every message is stored, each
    publisher's messages of a key in the order it published them."""
    redis_client.flushall()
    flow = streamsub.PublishFlowControl(message_limit=40, byte_limit=4096)
    batch = streamsub.BatchSettings(max_messages=8, max_latency=0.002)
    topics = ["blk-a", "blk-b", "blk-c"]
    async with streamsub.connect(
        server.url, publish_flow_control=flow, batch_settings=batch
    ) as client:
        for topic in topics:
            await client.create_topic(topic, partitions=4)
        gate = client._publish_gate
        peak = [0, 0]
        waited = 0
        done = False

        async def sample() -> None:
            nonlocal waited
            while not done:
                messages, size = gate.outstanding
                peak[0], peak[1] = max(peak[0], messages), max(peak[1], size)
                waited = max(waited, gate.waiting)
                await asyncio.sleep(0)

        async def publisher(p: int) -> list[str]:
            rng = random.Random(p)
            topic = topics[p % 3]
            ids: list[str] = []
            seq = 0
            for _ in range(10):  # bursts of calls made at once: their order is call order
                burst: list[Awaitable[str | list[str]]] = []
                for _ in range(3):
                    key = None if p % 5 == 0 else f"key-{rng.randrange(3)}"
                    data = f"{p}:{seq:04}:".encode().ljust(rng.randint(8, 40), b".")
                    seq += 1
                    if rng.random() < 0.5:
                        burst.append(client.publish(topic, data, ordering_key=key))
                    else:  # a call of up to 6 messages, admitted as a whole
                        parts = [
                            streamsub.OutgoingMessage(data=data + bytes([65 + i]), ordering_key=key)
                            for i in range(rng.randint(1, 6))
                        ]
                        burst.append(client.publish_many(topic, parts))
                for result in await asyncio.gather(*burst):
                    ids.extend([result] if isinstance(result, str) else result)
            return ids

        sampler = asyncio.create_task(sample())
        async with asyncio.timeout(60):
            results = await asyncio.gather(*(publisher(p) for p in range(40)))
        done = True
        await sampler
        assert gate.outstanding == (0, 0)
    assert peak[0] <= 40, f"{peak[0]} messages outstanding, limit 40"
    assert peak[1] <= 4096, f"{peak[1]} bytes outstanding, limit 4096"
    assert peak[0] > 30, "the limit was never approached: the test proves nothing"
    assert waited > 0, "no publish ever waited: the test proves nothing"

    total = sum(len(ids) for ids in results)
    stored = [m for topic in topics for m in _stored(redis_client, topic, 4)]
    assert len(stored) == total, f"{total} published, {len(stored)} stored"
    by_key: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
    for key, data in stored:
        p, seq, rest = data.split(b":", 2)
        by_key.setdefault((key, p.decode()), []).append((int(seq), rest))
    for (key, p), seen in by_key.items():
        if key:  # keyless messages carry no order
            assert seen == sorted(seen), f"publisher {p}'s messages of {key} out of order"


async def test_block_lets_a_call_larger_than_the_limit_go_alone(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With BLOCK, a publish_many larger than the whole limit waits for nothing to be
    outstanding, is stored, and publishes behind it follow: no deadlock."""
    redis_client.flushall()
    flow = streamsub.PublishFlowControl(message_limit=10, byte_limit=10_000)
    async with streamsub.connect(server.url, publish_flow_control=flow) as client:
        await client.create_topic("big", partitions=2)
        async with asyncio.timeout(10):
            small = [client.publish("big", b"s", ordering_key="k") for _ in range(8)]
            large = client.publish_many(
                "big", [streamsub.OutgoingMessage(data=b"L", ordering_key="k")] * 25
            )
            after = client.publish("big", b"a", ordering_key="k")
            *_, big_ids, _ = await asyncio.gather(*small, large, after)
        assert len(big_ids) == 25
    stored = [d for k, d in _stored(redis_client, "big", 2) if k == "k"]
    assert stored == [b"s"] * 8 + [b"L"] * 25 + [b"a"]


async def test_error_refuses_whole_calls_at_the_limit_and_publishing_resumes_after(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With ERROR and a 20-message limit, while 15 messages are outstanding a 10-message
    publish_many raises FlowControlLimitError naming message_limit and writes nothing
    of it, 5 more fit, one more is refused; a call over a byte limit or over the whole
    limit is refused too; once writes complete, the same calls succeed."""
    redis_client.flushall()
    backend = _Gated(server.url)
    flow = streamsub.PublishFlowControl(
        message_limit=20, byte_limit=2000, limit_exceeded_behavior=ERROR
    )
    loop = asyncio.get_running_loop()
    loop.call_later(15, backend.gate.set)  # a failing test still ends
    async with streamsub.Client(backend, publish_flow_control=flow) as client:
        await client.create_topic("err", partitions=3)
        held = asyncio.ensure_future(
            client.publish_many("err", [f"held-{i}".encode() for i in range(15)])
        )
        await until(lambda: client._publish_gate.outstanding[0] == 15, 5, "15 outstanding")
        rejected = [f"rejected-{i}".encode() for i in range(10)]
        with pytest.raises(streamsub.FlowControlLimitError, match="message_limit \\(20\\)") as info:
            async with asyncio.timeout(2):  # a refusal is at once, never a wait
                await client.publish_many("err", rejected)
        assert isinstance(info.value, streamsub.ResourceExhaustedError)
        assert "nothing of it was written" in str(info.value)
        fits = asyncio.ensure_future(
            client.publish_many("err", [f"fits-{i}".encode() for i in range(5)])
        )
        await until(lambda: client._publish_gate.outstanding[0] == 20, 5, "20 outstanding")
        with pytest.raises(streamsub.FlowControlLimitError):
            async with asyncio.timeout(2):
                await client.publish("err", b"one-too-many", ordering_key="k")

        backend.gate.set()
        async with asyncio.timeout(10):
            await asyncio.gather(held, fits)
        assert client._publish_gate.outstanding == (0, 0)
        with pytest.raises(streamsub.FlowControlLimitError, match="byte_limit \\(2000\\)"):
            await client.publish("err", b"x" * 2500)
        with pytest.raises(streamsub.FlowControlLimitError, match="message_limit"):
            await client.publish_many("err", [b"y"] * 21)
        assert len(await client.publish_many("err", rejected)) == 10
    data = sorted(d for _, d in _stored(redis_client, "err", 3))
    expected = [f"held-{i}".encode() for i in range(15)] + [f"fits-{i}".encode() for i in range(5)]
    assert data == sorted(expected + rejected), "a refused call left messages behind"


async def test_ignore_goes_past_the_limit(server: RedisServer, redis_client: redis.Redis) -> None:
    """With IGNORE and a 10-message limit, 100 messages published into a stalled
    server are all outstanding at once, nobody waits, and all are stored after."""
    redis_client.flushall()
    backend = _Gated(server.url)
    flow = streamsub.PublishFlowControl(message_limit=10, limit_exceeded_behavior=IGNORE)
    loop = asyncio.get_running_loop()
    loop.call_later(15, backend.gate.set)  # a failing test still ends
    async with streamsub.Client(backend, publish_flow_control=flow) as client:
        await client.create_topic("ign", partitions=2)
        calls = [
            asyncio.ensure_future(client.publish("ign", f"{i}".encode(), ordering_key=f"k{i % 3}"))
            for i in range(100)
        ]
        await until(lambda: client._publish_gate.outstanding[0] == 100, 5, "100 outstanding")
        assert client._publish_gate.waiting == 0
        backend.gate.set()
        async with asyncio.timeout(10):
            await asyncio.gather(*calls)
    assert len(_stored(redis_client, "ign", 2)) == 100


async def test_the_limit_is_per_client_across_topics(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Messages outstanding on one topic count against a publish to another topic of
    the same client, not of another client."""
    redis_client.flushall()
    backend = _Gated(server.url)
    flow = streamsub.PublishFlowControl(message_limit=10, limit_exceeded_behavior=ERROR)
    loop = asyncio.get_running_loop()
    loop.call_later(15, backend.gate.set)  # a failing test still ends
    async with streamsub.Client(backend, publish_flow_control=flow) as client:
        await client.create_topic("top1", partitions=1)
        await client.create_topic("top2", partitions=1)
        held = asyncio.ensure_future(client.publish_many("top1", [b"a"] * 10))
        await until(lambda: client._publish_gate.outstanding[0] == 10, 5, "10 outstanding")
        with pytest.raises(streamsub.FlowControlLimitError):
            async with asyncio.timeout(2):
                await client.publish("top2", b"b")
        async with streamsub.connect(server.url, publish_flow_control=flow) as other:
            assert await other.publish("top2", b"c")
        backend.gate.set()
        await held
