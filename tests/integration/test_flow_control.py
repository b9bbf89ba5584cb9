"""Flow control bounds what a subscriber holds in bytes, not only in messages."""

from __future__ import annotations

import asyncio
import collections
import os

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._layout import commands_logged, log_every_command, stream_key
from tests._wait import until
from tests.conftest import ON_CLUSTER

HANDLING = 0.01 if ON_CLUSTER else 0.002
"""Seconds a backlog handler takes: longer on a cluster, whose reads (one pipelined
poll over the nodes) bring fewer messages a second than a standalone server's, so
that there too the handlers, not the reads, are the bottleneck and the budget fills."""


async def test_held_bytes_stay_under_max_bytes_with_large_messages(
    client: streamsub.Client,
) -> None:
    """200 KB messages over 4 partitions with max_bytes of 1 MB: however many wait
    in Redis, what the subscriber holds never passes 1 MB (messages read and not
    yet settled, on hold or running)."""
    await client.create_topic("large", partitions=4)
    await client.create_subscription("large-sub", topic="large")
    await client.publish_many(
        "large",
        [
            streamsub.OutgoingMessage(data=bytes([i]) * 200_000, ordering_key=f"k{i}")
            for i in range(40)
        ],
    )
    release = asyncio.Event()
    handled = 0

    async def handler(message: streamsub.Message) -> None:
        nonlocal handled
        await release.wait()
        handled += 1

    held: list[int] = []
    flow = streamsub.FlowControl(max_messages=1000, max_bytes=1_000_000)
    async with client.subscribe("large-sub", handler, flow_control=flow) as sub:

        def filled() -> bool:
            held.append(sub.statistics().flow.outstanding_bytes)
            return held[-1] >= 800_000

        # The budget used (not starved), however long a busy machine takes to
        # read 800 KB; then held a while longer, sampled, with every handler waiting.
        await until(filled, 30, "800 KB held")
        for _ in range(20):
            held.append(sub.statistics().flow.outstanding_bytes)
            await asyncio.sleep(0.05)
        release.set()

        def sample() -> bool:
            held.append(sub.statistics().flow.outstanding_bytes)
            return sub.statistics().acked == 40

        await until(sample, 20, "all 40 acked")
    assert max(held) <= 1_000_000, max(held)
    assert max(held) >= 800_000  # the budget was used, not starved
    assert handled == 40


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_max_messages_50_over_a_backlog_of_100000(client: streamsub.Client) -> None:
    """A backlog of 100,000 messages over 10 partitions, max_messages=50: sampled
    throughout, never more than 50 handlers at once and never more than 50
    messages held unacked; reading pauses at full load and resumes, again and
    again (``pauses`` counts each pause: sampling ``paused`` saw a pause in 0
    to 13 of about 400 samples, the pauses being short, and failed when it saw
    none); the process's memory stays flat from the first 10,000 to the last.

    10 partitions, so that a read (an equal share of the room from each: 5)
    fills the budget: over 8, reads of 48 reached full load only when a second
    small read came in time."""
    await client.create_topic("backlog", partitions=10)
    await client.create_subscription("backlog-sub", topic="backlog")
    payload = b"x" * 200
    for _ in range(20):
        await client.publish_many("backlog", [payload] * 5000)
    running = most_running = handled = 0
    rss_after_warmup = 0

    async def handler(message: streamsub.Message) -> None:
        nonlocal running, most_running, handled, rss_after_warmup
        running += 1
        most_running = max(most_running, running)
        await asyncio.sleep(HANDLING)
        running -= 1
        handled += 1
        if handled == 10_000:
            rss_after_warmup = _rss_bytes()

    held: list[int] = []
    flow = streamsub.FlowControl(max_messages=50)
    async with client.subscribe("backlog-sub", handler, flow_control=flow) as sub:

        def sample() -> bool:
            stats = sub.statistics()
            held.append(stats.flow.outstanding_messages)
            return stats.acked == 100_000

        await until(sample, 240, "all 100,000 acked")
        pauses = sub.statistics().flow.pauses
    growth = _rss_bytes() - rss_after_warmup
    assert handled == 100_000
    assert most_running <= 50
    assert max(held) <= 50, max(held)
    assert max(held) >= 40  # the budget was used, not starved
    assert most_running >= 40
    # A second pause follows a resume. (Measured: 122 to 205 pauses on one server,
    # about 2,300 on a cluster, whose slower handlers keep the budget full.)
    assert pauses >= 2, f"reading paused {pauses} times at full load, or never resumed"
    assert growth < 30 * 2**20, f"memory grew by {growth / 2**20:.1f} MiB"


@pytest.mark.standalone  # the reads are watched in a private server's slow log
async def test_a_huge_max_messages_reads_a_deep_backlog_a_bounded_read_at_a_time(
    private_server: RedisServer,
) -> None:
    """max_messages of 1,000,000 over a backlog of 12,000 messages in 4
    partitions: every message is handled once, and the reads ask for 1,000
    messages (MAX_READ) over their partitions at most, and that much while the
    backlog lasts. One read asked for a third of max_messages: the whole
    backlog in one reply. Each command the server runs is in its slow log
    (threshold 0), with its arguments."""
    admin = redis.Redis.from_url(private_server.url)
    try:
        async with streamsub.connect(private_server.url) as client:
            await client.create_topic("deep", partitions=4)
            await client.create_subscription("deep-sub", topic="deep")
            for chunk in range(3):
                await client.publish_many(
                    "deep",
                    [
                        streamsub.OutgoingMessage(data=b"%d" % n, ordering_key=f"k{n % 40}")
                        for n in range(chunk * 4_000, (chunk + 1) * 4_000)
                    ],
                )
            log_every_command(admin)
            handled: collections.Counter[bytes] = collections.Counter()

            def handler(message: streamsub.Message) -> None:  # a plain def
                handled[message.data] += 1

            flow = streamsub.FlowControl(max_messages=1_000_000)
            async with client.subscribe("deep-sub", handler, flow_control=flow):
                await until(lambda: len(handled) == 12_000, 60, "all 12,000 handled")
            reads = commands_logged(admin, b"XREADGROUP")
    finally:
        admin.close()
    assert set(handled.values()) == {1}
    asked = []
    for args in reads:  # XREADGROUP GROUP g c COUNT n [BLOCK ms] STREAMS k... id...
        count = int(args[args.index(b"COUNT") + 1])
        streams = (len(args) - args.index(b"STREAMS") - 1) // 2
        asked.append(count * streams)
    # As large as the cap while the backlog lasts (250 from each partition),
    # never larger.
    assert max(asked) == 1_000, sorted(asked)[-5:]


async def test_delete_subscription_raises_what_the_server_refused(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """delete_subscription reports a server error (here a partition key of the
    wrong type) instead of swallowing it; a missing group is no error."""
    await client.create_topic("broken", partitions=3)
    await client.create_subscription("broken-sub", topic="broken")
    await client.create_subscription("broken-sub2", topic="broken")
    redis_client.xgroup_destroy(stream_key(redis_client, "broken", 0), "broken-sub2")
    await client.delete_subscription("broken-sub2")  # one group already gone: fine
    redis_client.delete(stream_key(redis_client, "broken", 1))
    redis_client.set(stream_key(redis_client, "broken", 1), "not a stream")
    with pytest.raises(streamsub.BackendError, match="WRONGTYPE"):
        await client.delete_subscription("broken-sub")


async def test_subscription_stats_fail_loudly_on_a_partition_without_its_group(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """subscription_stats does not silently sum fewer partitions: a partition whose
    group is gone is a SubscriptionNotFoundError naming it."""
    await client.create_topic("partial", partitions=4)
    await client.create_subscription("partial-sub", topic="partial")
    redis_client.xgroup_destroy(stream_key(redis_client, "partial", 2), "partial-sub")
    with pytest.raises(streamsub.SubscriptionNotFoundError, match="partition 2"):
        await client.subscription_stats("partial-sub")
