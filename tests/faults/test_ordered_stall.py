"""An owner whose event loop stalls for longer than its partition lease — a
blocking call in an ``async def`` handler — wakes to find its partitions owned
by another subscriber: it starts nothing more of them, and order holds."""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.faults._ordered_subscriber import check_key

ROOT = Path(__file__).resolve().parents[2]
LEASE = 4.0
"""Over three read blocks (1 s): a read sent while the lease was surely ours
is answered before another subscriber can own the partition."""
KEYS = 40
WAVE = 100
"""Messages per key in each of the two waves."""


def _start(url: str, consumer: str, stall: float) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.faults._ordered_subscriber",
            url,
            "stall-sub",
            consumer,
            str(stall),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "STREAMSUB_TEST_OWNERSHIP_LEASE": str(LEASE)},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.timeout(180)
async def test_a_stalled_owner_starts_nothing_of_partitions_it_lost(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Two subscriber processes on an ordered subscription, 40 keys; a stalls its
    whole event loop for its lease plus 3 s early on, b takes its partitions over.
    When a wakes, its handlers that were running finish, but it starts none of the
    messages it holds of partitions it lost (nor reads them): every key's handlings
    stay in publish order (b handles again what a had started, before anything
    later). a then gets its share back, and a second wave is handled by both, in
    order."""
    redis_client.flushall()
    inspect = redis_client
    keys = [f"key-{k}" for k in range(KEYS)]
    async with streamsub.connect(server.url) as client:
        await client.create_topic("stall", partitions=8)
        await client.create_subscription("stall-sub", topic="stall", enable_message_ordering=True)

        async def publish(first: int, last: int) -> None:
            for base in range(first, last, 10):
                await client.publish_many(
                    "stall",
                    [
                        streamsub.OutgoingMessage(data=f"{key}:{i}".encode(), ordering_key=key)
                        for i in range(base, base + 10)
                        for key in keys
                    ],
                )

        def distinct() -> int:
            records = inspect.lrange("test:handled", 0, -1)
            return len({record.rsplit(b" ", 2)[0] for record in records})

        async def owners() -> set[str]:
            stats = await client.subscription_stats("stall-sub")
            return {owner for owner, _ in stats.owners.values()}

        procs = {"a": _start(server.url, "a", LEASE + 3), "b": _start(server.url, "b", 0)}
        try:
            await publish(0, WAVE)
            await until(lambda: inspect.get("test:stalled") == b"a", 60, "a to stall")
            await until(lambda: distinct() >= KEYS * WAVE, 90, "the first wave handled")
            deadline = asyncio.get_running_loop().time() + 60
            while await owners() != {"a", "b"}:  # a is back and owns its share again
                assert asyncio.get_running_loop().time() < deadline, await owners()
                await asyncio.sleep(0.1)
            await publish(WAVE, 2 * WAVE)
            await until(lambda: distinct() >= 2 * KEYS * WAVE, 90, "the second wave handled")
            journal = inspect.lrange("test:handled", 0, -1)
        finally:
            for process in procs.values():
                process.kill()
                process.wait()
    per_key: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
    after_stall: collections.Counter[str] = collections.Counter()
    started_before = 0
    for raw in journal:
        key, index, attempt, consumer = raw.decode().split()
        if consumer == "a-pre":  # given its message before the stall: ran then
            started_before += 1
            continue
        per_key[key].append((int(index), int(attempt), consumer))
        if int(index) >= WAVE:
            after_stall[consumer] += 1
    assert sorted(per_key) == sorted(keys)
    assert started_before <= KEYS, started_before  # at most one running per key
    restarts = sum(check_key(per_key[key], killed="a") for key in keys)
    assert restarts >= 1, "b handled nothing again: the stall did not cost a its partitions"
    assert set(after_stall) == {"a", "b"}, after_stall
