"""Resharding under traffic (issue 9, "Done when: Resharding"): two partitions'
slots migrate to other masters, each held in the window redis-cli --cluster
reshard opens (every key already on the importing node, the slot not yet handed
over), while messages are published, delivered and acknowledged. The traffic
must flow *through* the window, not only before and after it."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis

import streamsub
from streamsub._backends.redis import _keys
from streamsub.testing import RedisClusterServers
from tests._wait import until
from tests.cluster._helpers import slot_held_migrating

HOLD = 1.5
"""Seconds each slot stays migrating with its keys already moved (the ASK window)
at the least; it stays so until traffic has flowed through the window (see
_window_problems), at most HOLD_AT_MOST seconds, however slow the machine."""
HOLD_AT_MOST = 60.0
PARTITIONS = 6
MOVED = (0, 1)


@pytest.fixture
async def client(cluster: RedisClusterServers) -> AsyncIterator[streamsub.Client]:
    inspect = cluster.client()
    inspect.flushall()
    inspect.close()
    async with streamsub.connect(cluster.url) as client:
        yield client


def _pending_asking(node: redis.Redis, stream: str, group: str) -> int:
    """XPENDING's count on the importing node, asked behind ASKING on one connection."""
    pipe = node.pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.execute_command("XPENDING", stream, group)
    return int(pipe.execute()[1]["pending"])


Window = tuple[float, float, int, int]
"""A migration window: (start, end, pending at start, pending at end)."""


def _window_problems(
    partition: int,
    window: Window,
    published: list[tuple[float, str]],
    delivered: list[tuple[float, str]],
) -> list[str]:
    """What did not flow through ``partition``'s migration window: a publish
    returned, a message delivered, an ack landed (the group's pending count on
    the importing node below what was pending plus what was delivered)."""
    start, end, pending_start, pending_end = window
    mine = f"{partition}-"
    pub = [i for t, i in published if start <= t <= end and i.startswith(mine)]
    got = [i for t, i in delivered if start <= t <= end and i.startswith(mine)]
    problems = []
    if not pub:
        problems.append(f"partition {partition}: no publish returned during its migration window")
    if not got:
        problems.append(f"partition {partition}: nothing delivered during its migration window")
    if pending_end >= pending_start + len(got):
        problems.append(
            f"partition {partition}: no ack landed during its migration window (pending "
            f"{pending_start} -> {pending_end}, {len(got)} delivered)"
        )
    return problems


def _move_held(
    cluster: RedisClusterServers,
    slot: int,
    stream: str,
    group: str,
    flowed: Callable[[Window], bool],
) -> Window:
    """Move ``slot`` to another master as redis-cli --cluster reshard does, holding
    it with all its keys on the target before SETSLOT NODE for HOLD seconds and
    then until ``flowed(window so far)`` (at most HOLD_AT_MOST seconds); return
    the window."""
    with slot_held_migrating(cluster, slot) as (_, target_port):
        target = cluster.node(target_port)
        try:
            start = time.monotonic()
            pending_start = _pending_asking(target, stream, group)
            time.sleep(HOLD)
            while True:
                pending_end = _pending_asking(target, stream, group)
                window = (start, time.monotonic(), pending_start, pending_end)
                if flowed(window) or window[1] - start > HOLD_AT_MOST:
                    return window
                time.sleep(0.05)
        finally:
            target.close()


@pytest.mark.timeout(180)
async def test_publish_delivery_and_acks_flow_through_two_held_slot_migrations(
    cluster: RedisClusterServers, client: streamsub.Client
) -> None:
    """While keyed messages are published without pause and two subscribers
    consume a 6-partition topic, partitions 0 and 1 migrate one after the other,
    each held with its keys already moved (1.5 s, and longer until the traffic
    went through, on a slow machine). In each window, messages of the
    moving partition are published (an id returned), delivered, and acknowledged
    (the group's pending count on the importing node falls below what was
    pending plus what was delivered); every publish returns an id, every message
    is delivered, and nothing stays pending."""
    await client.create_topic("reshard", partitions=PARTITIONS)
    await client.create_subscription("reshard-sub", topic="reshard", ack_deadline=5.0)
    record = await client._backend.get_topic("reshard")
    assert record is not None
    streams = [
        _keys.stream_key(_keys.partition_tag("reshard", p, record.salts[p]))
        for p in range(PARTITIONS)
    ]
    inspect = cluster.client()
    slots = {p: inspect.keyslot(streams[p]) for p in MOVED}
    inspect.close()
    assert len(set(slots.values())) == len(MOVED)

    published: list[tuple[float, str]] = []
    delivered: list[tuple[float, str]] = []
    failures: list[BaseException] = []
    stop = asyncio.Event()

    async def handler(message: streamsub.Message) -> None:
        delivered.append((time.monotonic(), message.message_id))

    async def publish() -> None:
        i = 0
        while not stop.is_set():
            calls = [
                client.publish("reshard", b"%d" % n, ordering_key=f"k{n % 60}")
                for n in range(i, i + 120)
            ]
            i += 120
            for result in await asyncio.gather(*calls, return_exceptions=True):
                if isinstance(result, str):
                    published.append((time.monotonic(), result))
                else:
                    failures.append(result)
            await asyncio.sleep(0.01)

    windows: dict[int, Window] = {}

    def reshard() -> None:
        for p in MOVED:

            def flowed(window: Window, p: int = p) -> bool:
                # Copies: the lists grow on the event loop's thread meanwhile.
                return not _window_problems(p, window, list(published), list(delivered))

            windows[p] = _move_held(cluster, slots[p], streams[p], "reshard-sub", flowed)

    async with (
        client.subscribe("reshard-sub", handler, consumer="a"),
        client.subscribe("reshard-sub", handler, consumer="b"),
    ):
        publisher = asyncio.create_task(publish())
        await until(lambda: len(delivered) >= 1000, 30, "traffic flowing")
        await asyncio.to_thread(reshard)
        await asyncio.sleep(1.0)
        stop.set()
        await publisher
        ids = {i for _, i in published}
        await until(lambda: {i for _, i in delivered} >= ids, 60, "every message delivered")

    assert failures == [], failures[:3]
    problems = [
        problem for p in MOVED for problem in _window_problems(p, windows[p], published, delivered)
    ]
    assert problems == [], "\n".join(problems)
    inspect = cluster.client()
    try:
        for stream in streams:
            assert inspect.xpending(stream, "reshard-sub")["pending"] == 0
    finally:
        inspect.close()
    counts = collections.Counter(i for _, i in delivered)
    assert set(counts) == ids
