"""Ordered subscriptions through a cluster's failover and resharding (issue 9,
"Done when": the ordering tests on a cluster). The standalone ordering fault
tests that kill or restart the server (tests/ordered_faults) are deselected on
a cluster, and the other failover and resharding tests here run plain
subscriptions: here an ordered one goes through a failover and a moving slot,
with two subscribers on two clients."""

from __future__ import annotations

import asyncio
import time

import pytest

import streamsub
from streamsub.testing import RedisClusterServers
from tests._wait import until
from tests.cluster._helpers import kill_master, partition_slot, slot_held_migrating
from tests.ordered_faults._keys import Journal, publish_rounds
from tests.ordered_faults._order import regressions

KEYS = 40
AFTER_STRIKE = 5
"""Rounds published once the strike is over (the failover done and the killed
master back as a replica, or the slot moved), before publishing stops."""


def _move_held(cluster: RedisClusterServers, slot: int, hold: float) -> None:
    """Move ``slot`` to another master as redis-cli --cluster reshard does,
    holding it ``hold`` s with its keys already moved before SETSLOT NODE."""
    with slot_held_migrating(cluster, slot):
        time.sleep(hold)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strike", ["sigkill", "reshard"])
async def test_an_ordered_subscription_keeps_key_order_through_a_failover_or_a_moving_slot(
    emptied: RedisClusterServers, strike: str
) -> None:
    """Two subscribers (two clients) of an ordered subscription of 8 partitions,
    40 keys published round by round with Durability(replicas=1) (a failed
    round published again, as users do); partition 0's master is SIGKILLed
    (started again once replaced), or partition 0's slot migrates to another
    master held 1.5 s with its keys moved; 5 more rounds after it. Every message
    of every round whose publish returned is handled, each key's first handlings
    in publish order, and afterwards every partition has exactly one owner."""
    cluster = emptied
    durability = streamsub.Durability(replicas=1)
    clients = [streamsub.connect(cluster.url, durability=durability) for _ in range(3)]
    admin = clients[2]
    try:
        await admin.create_topic("orders", partitions=8)
        await admin.create_subscription(
            "billing", topic="orders", enable_message_ordering=True, ack_deadline=5.0
        )
        slot = partition_slot(cluster, "orders", 0)
        journal = Journal()
        keys = [f"key-{k}" for k in range(KEYS)]
        stored: set[tuple[str, int]] = set()
        stop = asyncio.Event()

        async with (
            clients[0].subscribe("billing", journal.handler("a"), consumer="a") as a,
            clients[1].subscribe("billing", journal.handler("b"), consumer="b") as b,
        ):
            publishing = asyncio.create_task(publish_rounds(admin, keys, stored, stop, again=True))
            await until(lambda: journal.distinct() >= KEYS * 20, 30, "20 rounds handled")
            if strike == "sigkill":
                await asyncio.to_thread(kill_master, cluster, slot)
            else:
                await asyncio.to_thread(_move_held, cluster, slot, 1.5)
            after = len(stored) // KEYS + AFTER_STRIKE
            await until(
                lambda: len(stored) // KEYS >= after, 30, f"{AFTER_STRIKE} rounds after the strike"
            )
            stop.set()
            await publishing
            await until(
                lambda: {(k, n) for k, n, _, _ in journal.records} >= stored,
                60,
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
    assert regressions(journal) == {}
    assert owned[0] | owned[1] == set(range(8)), owned
    assert not owned[0] & owned[1], owned
