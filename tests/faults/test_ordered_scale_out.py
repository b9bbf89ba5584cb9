"""Ordering keys hold while an ordered subscription scales out and a subscriber
crashes: four subscriber processes, one SIGKILLed mid-way, another added later."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.faults._ordered_subscriber import check_key, check_one_at_a_time

ROOT = Path(__file__).resolve().parents[2]
KEYS = 200
MESSAGES = 50_000


def _start(url: str, consumer: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.faults._ordered_subscriber", url, "ordered-sub", consumer],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_order_holds_with_four_subscribers_one_killed_and_one_added(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """50,000 messages over 200 keys, four subscriber processes on an ordered
    subscription; one is SIGKILLed a quarter of the way and a fifth joins at
    three fifths (the rest is published once it owns its share): every message
    is handled, no key ever runs two handlers at once, each key's first
    handlings are in publish order (the killed one's held messages handled again before anything
    later of their keys), and every subscriber that was alive received work."""
    redis_client.flushall()
    inspect = redis_client
    async with streamsub.connect(server.url) as client:
        await client.create_topic("ordered", partitions=16)
        await client.create_subscription(
            "ordered-sub", topic="ordered", enable_message_ordering=True
        )
        procs = {name: _start(server.url, name) for name in ("a", "b", "c", "d")}
        try:
            keys = [f"key-{k}" for k in range(KEYS)]

            async def publish(first: int, last: int) -> None:
                for base in range(first, last, 5):
                    await client.publish_many(
                        "ordered",
                        [
                            streamsub.OutgoingMessage(
                                data=f"{key}:{index}".encode(), ordering_key=key
                            )
                            for index in range(base, base + 5)
                            for key in keys
                        ],
                    )
                    await asyncio.sleep(0.05)

            def distinct() -> int:
                records = inspect.lrange("test:handled", 0, -1)
                return len({record.rsplit(b" ", 2)[0] for record in records})

            # Three fifths, with the kill a quarter of the way; then the fifth
            # subscriber joins and, once it owns its share, the rest comes.
            per_key = MESSAGES // KEYS
            publishing = asyncio.create_task(publish(0, per_key * 3 // 5))
            handled = lambda: inspect.llen("test:handled")  # noqa: E731
            await until(lambda: handled() >= MESSAGES // 4, 120, "a quarter handled")
            procs["a"].send_signal(signal.SIGKILL)
            procs["a"].wait()
            await publishing
            await until(lambda: distinct() >= MESSAGES * 3 // 5, 120, "three fifths handled")
            procs["e"] = _start(server.url, "e")

            async def e_owns() -> bool:
                stats = await client.subscription_stats("ordered-sub")
                return "e" in {owner for owner, _ in stats.owners.values()}

            deadline = asyncio.get_running_loop().time() + 60
            while not await e_owns():
                assert asyncio.get_running_loop().time() < deadline, "e never got partitions"
                await asyncio.sleep(0.1)
            await publish(per_key * 3 // 5, per_key)
            await until(lambda: distinct() >= MESSAGES, 180, "every message handled")
            journal = inspect.lrange("test:handled", 0, -1)
            events = inspect.lrange("test:events", 0, -1)
        finally:
            for process in procs.values():
                process.kill()
                process.wait()
    per_key: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
    by_consumer: collections.Counter[str] = collections.Counter()
    for raw in journal:
        key, index, attempt, consumer = raw.decode().split()
        per_key[key].append((int(index), int(attempt), consumer))
        by_consumer[consumer] += 1
    assert sorted(per_key) == sorted(keys)
    restarts = sum(check_key(per_key[key], killed="a") for key in keys)
    check_one_at_a_time(events, killed="a")
    assert all(max(i for i, _, _ in per_key[key]) == MESSAGES // KEYS - 1 for key in keys)
    assert set(by_consumer) == {"a", "b", "c", "d", "e"}, by_consumer
    assert restarts <= KEYS, restarts
