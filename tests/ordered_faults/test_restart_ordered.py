"""Redis restarted under an ordered subscription's subscribers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import streamsub
from streamsub.testing import redis_server
from tests._wait import until
from tests.ordered_faults._keys import Journal, publish_rounds

# Standalone: SIGKILLs and restarts a redis-server (a cluster's failover:
# tests/cluster/test_cluster_failover.py).
pytestmark = pytest.mark.standalone

KEYS = 40
AFTER_RESTART = 5
"""Rounds stored after the restart before publishing stops."""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("down", [1.0, 12.0])
async def test_order_and_ownership_hold_across_a_server_restart(
    tmp_path: Path, redis_binary: str | None, down: float
) -> None:
    """Two subscribers (two clients) on an ordered subscription of 8 partitions, 40
    keys published steadily; redis-server (AOF, fsync always) is SIGKILLed and
    restarted after ``down`` seconds (shorter and longer than the 10-s partition
    lease); publishing goes on through it (a failed round published again, as
    users do) until 5 rounds were stored after the restart. Every stored
    message is handled, each key's first handlings in publish order, and
    afterwards every partition has exactly one owner."""
    with redis_server(tmp_path / "redis", appendfsync="always", binary=redis_binary) as server:
        clients = [streamsub.connect(server.url) for _ in range(3)]
        admin = clients[2]
        try:
            await admin.create_topic("orders", partitions=8)
            await admin.create_subscription(
                "billing", topic="orders", enable_message_ordering=True, ack_deadline=5.0
            )
            journal = Journal()
            keys = [f"key-{k}" for k in range(KEYS)]
            stored: set[tuple[str, int]] = set()
            stop = asyncio.Event()

            async with (
                clients[0].subscribe("billing", journal.handler("a"), consumer="a") as a,
                clients[1].subscribe("billing", journal.handler("b"), consumer="b") as b,
            ):
                publishing = asyncio.create_task(
                    publish_rounds(admin, keys, stored, stop, again=True)
                )
                await until(lambda: journal.distinct() >= KEYS * 20, 30, "20 rounds handled")
                server.kill()
                await asyncio.sleep(down)
                server.start()
                after = len(stored) // KEYS + AFTER_RESTART
                await until(
                    lambda: len(stored) // KEYS >= after,
                    30,
                    f"{AFTER_RESTART} rounds after the restart",
                )
                stop.set()
                await publishing
                await until(
                    lambda: {(k, n) for k, n, _, _ in journal.records} >= stored,
                    40,
                    "every stored message",
                )
                await asyncio.sleep(4.0)
                owned = [set(a.statistics().owned), set(b.statistics().owned)]
        finally:
            for one in clients:
                await one.aclose()
    rounds = 1 + max(n for _, n in stored)
    wrong = {
        k: v[:12] for k, v in journal.first_handlings().items() if v[:rounds] != list(range(rounds))
    }
    assert not wrong, f"keys out of publish order: {dict(list(wrong.items())[:4])}"
    assert owned[0] | owned[1] == set(range(8)), owned
    assert not owned[0] & owned[1], owned
