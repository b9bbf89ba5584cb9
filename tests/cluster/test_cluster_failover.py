"""Publish durability and a failover under traffic, on a real Redis Cluster."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import pytest

import streamsub
from streamsub._backends.redis import _keys
from streamsub._engine._retrying import ERROR_BACKOFF
from streamsub.testing import RedisClusterServers
from tests._wait import until
from tests.cluster._helpers import (
    Strike,
    assert_nothing_pending,
    failover,
    kill_master,
    partition_slot,
)


async def test_durability_waits_for_replicas_and_fails_when_too_few_confirm(
    emptied: RedisClusterServers,
) -> None:
    """With one replica per master, Durability(replicas=1) publishes 2,000
    messages over 6 partitions normally, while replicas=2 raises
    UnavailableError after its timeout, saying the batch is stored but not
    confirmed."""
    url = emptied.url
    async with streamsub.connect(url, durability=streamsub.Durability(replicas=1)) as client:
        await client.create_topic("durable", partitions=6)
        ids = await client.publish_many("durable", [b"m%d" % i for i in range(2000)])
        assert len(set(ids)) == 2000
    too_many = streamsub.Durability(replicas=2, timeout=0.3)
    async with streamsub.connect(url, durability=too_many) as client:
        started = time.monotonic()
        with pytest.raises(streamsub.UnavailableError, match="only 1 of the 2 replicas"):
            await client.publish("durable", b"unconfirmed")
        assert time.monotonic() - started >= 0.3


def test_durability_timeout_must_stay_below_the_socket_timeout() -> None:
    """A WAIT longer than the socket timeout would count as a dead connection:
    refused up front, as are ill-formed settings."""
    with pytest.raises(streamsub.InvalidArgumentError, match="below the socket timeout"):
        streamsub.connect(
            "redis://127.0.0.1:1/0",
            socket_timeout=2.0,
            durability=streamsub.Durability(replicas=1, timeout=5.0),
        )
    with pytest.raises(streamsub.InvalidArgumentError):
        streamsub.Durability(replicas=-1)
    with pytest.raises(streamsub.InvalidArgumentError):
        streamsub.Durability(replicas=1, timeout=0)


async def run_through(
    cluster: RedisClusterServers,
    topic: str,
    fail: Callable[[RedisClusterServers, int], Strike],
) -> None:
    """20,000 keyed messages published in overlapping batches with
    Durability(replicas=1) while two subscribers consume; ``fail`` strikes the
    master of partition 0 a quarter of the way in. Every message whose publish
    returned an id is delivered, at least half were published, and none stays
    pending."""
    durability = streamsub.Durability(replicas=1)
    async with streamsub.connect(cluster.url, durability=durability) as client:
        await client.create_topic(topic, partitions=8)
        await client.create_subscription(f"{topic}-sub", topic=topic, ack_deadline=5.0)
        record = await client._backend.get_topic(topic)
        assert record is not None
        tags = [_keys.partition_tag(topic, p, s) for p, s in enumerate(record.salts)]
        inspect = cluster.client()
        slot = inspect.keyslot(_keys.stream_key(tags[0]))
        inspect.close()

        seen: collections.Counter[str] = collections.Counter()

        async def handler(message: streamsub.Message) -> None:
            seen[message.message_id] += 1

        ids: list[str] = []
        failed = 0
        total = 20_000

        async def publish() -> None:
            nonlocal failed
            for start in range(0, total, 500):
                calls = [
                    client.publish(topic, b"%d" % i, ordering_key=f"k{i % 100}")
                    for i in range(start, start + 500)
                ]
                for result in await asyncio.gather(*calls, return_exceptions=True):
                    if isinstance(result, str):
                        ids.append(result)
                    elif isinstance(
                        result, streamsub.OrderingKeyPausedError | streamsub.UnavailableError
                    ):
                        failed += 1
                    else:
                        raise result
                for key in range(100):
                    client.resume_publish(topic, f"k{key}")

        async with (
            client.subscribe(f"{topic}-sub", handler, consumer="a"),
            client.subscribe(f"{topic}-sub", handler, consumer="b"),
        ):
            publisher = asyncio.create_task(publish())
            await until(lambda: len(ids) >= total // 4, 60, "a quarter published")
            strike = await asyncio.to_thread(fail, cluster, slot)
            await publisher
            await until(lambda: set(seen) >= set(ids), 90, "every published message delivered")
    assert strike.old != strike.new
    assert len(ids) + failed == total
    assert len(ids) >= total // 2
    assert_nothing_pending(cluster, tags, f"{topic}-sub")


async def test_a_manual_failover_under_traffic_loses_no_published_message(
    emptied: RedisClusterServers,
) -> None:
    """CLUSTER FAILOVER on the replica of partition 0's master during a
    20,000-message run with Durability(replicas=1): nothing whose publish
    returned an id is lost (see run_through)."""
    await run_through(emptied, "failing", failover)


async def test_a_killed_master_under_traffic_loses_no_published_message(
    emptied: RedisClusterServers,
) -> None:
    """SIGKILL of partition 0's master during a 20,000-message run with
    Durability(replicas=1): its replica takes over, and nothing whose publish
    returned an id is lost (see run_through)."""
    await run_through(emptied, "killed", kill_master)


RETRY_BOUND = ERROR_BACKOFF[1] + 1.0
"""Seconds past the cluster being whole again within which publishing to and
delivery from the failed-over partition resume: the readers' longest pause
between retries plus one second for the retry itself; plus, in the test, the
slowest publish (or publish-to-delivery) of the last STEADY seconds before the
strike (sent and delivered before it), which a busy machine makes longer for
every message alike."""
STEADY = 2.0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fail", [kill_master, failover], ids=["sigkill", "cluster-failover"])
async def test_a_failed_over_partition_resumes_within_a_bounded_retry_of_the_failover(
    emptied: RedisClusterServers, fail: Callable[[RedisClusterServers, int], Strike]
) -> None:
    """Durability(replicas=1), 100 keyed publishes at a time without pause to an
    8-partition topic that two subscribers consume; partition 0's master is
    struck (SIGKILL, started again once replaced; or CLUSTER FAILOVER on its
    replica). Within RETRY_BOUND seconds of the cluster being whole again, a
    publish to partition 0 returns an id, and a message of partition 0
    published after the strike is delivered; every message whose publish
    returned an id is delivered. (RETRY_BOUND is counted from the cluster
    being whole plus what a publish, or a delivery, took just before the
    strike: the machine's own speed at that time.)"""
    cluster = emptied
    async with streamsub.connect(
        cluster.url, durability=streamsub.Durability(replicas=1)
    ) as client:
        await client.create_topic("stall", partitions=8)
        await client.create_subscription("stall-sub", topic="stall", ack_deadline=5.0)
        slot = partition_slot(cluster, "stall", 0)
        published: list[tuple[float, float, str]] = []  # (sent, returned, id)
        delivered: dict[str, float] = {}
        failed: list[tuple[float, str]] = []
        stop = asyncio.Event()

        async def handler(message: streamsub.Message) -> None:
            delivered.setdefault(message.message_id, time.monotonic())

        async def one(n: int) -> None:
            key = f"k{n % 100}"
            sent = time.monotonic()
            try:
                message_id = await client.publish("stall", b"%d" % n, ordering_key=key)
            except (streamsub.UnavailableError, streamsub.OrderingKeyPausedError) as exc:
                failed.append((sent, f"{type(exc).__name__}: {str(exc)[:150]}"))
                client.resume_publish("stall", key)
                return
            published.append((sent, time.monotonic(), message_id))

        async def publish() -> None:
            n = 0
            while not stop.is_set():
                await asyncio.gather(*(one(i) for i in range(n, n + 100)))
                n += 100
                await asyncio.sleep(0.01)

        def after_strike(started: float) -> list[str]:
            """Ids of partition 0 whose publish began after ``started``."""
            return [i for sent, _, i in published if i.startswith("0-") and sent > started]

        async with (
            client.subscribe("stall-sub", handler, consumer="a"),
            client.subscribe("stall-sub", handler, consumer="b"),
        ):
            publisher = asyncio.create_task(publish())
            await until(lambda: len(delivered) >= 2000, 60, "traffic flowing")
            struck = await asyncio.to_thread(fail, cluster, slot)
            timing = (
                f"promoted {struck.promoted - struck.started:.1f} s and whole "
                f"{struck.whole - struck.started:.1f} s after the strike"
            )
            try:
                await until(
                    lambda: any(i in delivered for i in after_strike(struck.started)),
                    60,
                    "a message of partition 0 published after the strike delivered",
                )
            except AssertionError as exc:
                late = sorted({e for t, e in failed if t > struck.whole + RETRY_BOUND})
                raise AssertionError(f"{exc}; {timing}; failures since: {late[:3]}") from None
            await asyncio.sleep(1.0)
            stop.set()
            await publisher
            ids = {i for _, _, i in published}
            await until(lambda: set(delivered) >= ids, 60, "every published message delivered")

    zero = after_strike(struck.started)
    first_publish = min(returned for _, returned, i in published if i in zero)
    first_delivery = min(delivered[i] for i in zero)
    steady = [
        (returned - sent, delivered[i] - sent)
        for sent, returned, i in published
        # Sent and delivered before the strike: what the strike held up is not the
        # machine's speed.
        if struck.started - STEADY <= sent
        and max(returned, delivered.get(i, struck.started)) < struck.started
    ]
    publish_bound = RETRY_BOUND + max(p for p, _ in steady)
    delivery_bound = RETRY_BOUND + max(d for _, d in steady)
    timing += f"; before it a publish took at most {publish_bound - RETRY_BOUND:.2f} s, a delivery "
    timing += f"{delivery_bound - RETRY_BOUND:.2f} s"
    assert first_publish - struck.whole <= publish_bound, (timing, first_publish - struck.whole)
    assert first_delivery - struck.whole <= delivery_bound, (timing, first_delivery - struck.whole)
