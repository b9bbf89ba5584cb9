"""The sweeps are not fenced in Redis (README, Partition ownership: "Not fenced:
the sweeps that take back idle or due entries of an owned partition"). A new
owner's take-over sweep claims every entry pending in the partition, idle or
not, parked nacks included (reclaim.lua with min-idle 0 and take_parked). When
such a request of a former owner reaches Redis late -- held in the network past
its lease, exactly the case fenced reads were built for -- it takes the live
owner's in-flight and held messages. The live owner runs them anyway (its token
still holds locally), their acks settle nothing, and they are delivered again
after later messages of their key were handled and acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._delaying_proxy import DelayingProxy
from tests.ordered_faults._keys import Journal, keyed, ordered
from tests.ordered_faults._order import holding, regressions


@pytest.mark.timeout(60)
async def test_a_former_owners_late_take_over_sweep_breaks_the_live_owners_key_order(
    client: streamsub.Client,
) -> None:
    """One partition, key k: 0..4 published. The live owner runs k:0 (held open)
    and holds k:1..4 for their turn. A take-over sweep a former owner sent
    before it lost the partition reaches Redis now (the exact request
    PartitionOwner._take sends: reclaim, min-idle 0, take_parked). Then k:5..9
    are published. Every message is handled; the key's handlings must never go
    back to an earlier message without handling again the later ones handled
    before it (Done when, order test: "no later message of that key is handled
    before it")."""
    await ordered(client, partitions=1, ack_deadline=2.0)
    backend = client._backend
    topic = await backend.get_topic("orders")
    assert topic is not None
    journal = Journal()
    gate = asyncio.Event()
    handle = holding(journal, "live", 0, gate)

    async with client.subscribe("billing", handle, consumer="live") as live:
        await until(lambda: live.statistics().owned != {}, 20, "the live owner to own p0")
        await client.publish_many("orders", keyed(["k"], 0, 5))
        await until(lambda: journal.distinct() == 1, 10, "k:0 running")
        await until(lambda: live.statistics().held_for_order == 4, 10, "k:1..4 held")
        # The former owner's take-over sweep, delivered late by the network,
        # under the (older) fencing token it held.
        former_token = live.statistics().owned[0] - 1
        stolen, _ = await backend.reclaim(
            topic, "billing", "former", {0: "-"}, 0, 100, 0, take_parked=True,
            tokens={0: former_token},
        )  # fmt: skip
        await client.publish_many("orders", keyed(["k"], 5, 10))
        gate.set()
        await until(lambda: journal.distinct() == 10, 20, "every message handled")
        await asyncio.sleep(6.0)  # the stolen entries come back once idle (2-s deadline)
    wrong = regressions(journal)
    assert not wrong, (
        f"a late, unfenced take-over sweep took {len(stolen)} entries from the live owner; "
        f"its key then went back after later messages were acked: {wrong}"
    )


@pytest.mark.standalone  # behind a TCP proxy in front of one redis-server
@pytest.mark.timeout(90)
async def test_a_take_over_sweep_held_in_the_network_past_the_lease_breaks_key_order(
    client: streamsub.Client, server: RedisServer, short_ownership_lease: float
) -> None:
    """The same end to end, with the network holding the request. Subscriber
    "former" (behind a proxy that holds what clients send, as a network does:
    tests/ordered_faults/_delaying_proxy.py) takes the partition; the network
    starts holding its bytes just as its take-over sweep goes out. Its lease
    (2 s here) runs out; "live" takes the partition, raises the fence, runs k:0
    (held open) and holds k:1..4. The network heals: the held sweep reaches
    Redis. Fenced reads do not help -- the sweep is no read -- and the key's
    handlings go back after later messages were acknowledged."""
    await ordered(client, partitions=1, ack_deadline=2.0)
    proxy = DelayingProxy()
    port = await proxy.start(server.port)
    journal = Journal()
    gate = asyncio.Event()
    handle = holding(journal, "live", 0, gate)

    async with (
        contextlib.aclosing(proxy),
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=30.0, trim_in_background=False
        ) as behind_proxy,
    ):
        backend = behind_proxy._backend
        real_reclaim = backend.reclaim
        held = asyncio.Event()

        async def reclaim(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("take_parked") and not held.is_set():
                held.set()
                proxy.hold()  # the network stalls just as the take-over sweep is sent
            return await real_reclaim(*args, **kwargs)

        backend.reclaim = reclaim  # type: ignore[method-assign]
        async with behind_proxy.subscribe("billing", lambda m: None, consumer="former"):
            await until(held.is_set, 20, "the former owner's take-over sweep")
            await asyncio.sleep(short_ownership_lease + 0.5)  # its lease runs out
            async with client.subscribe("billing", handle, consumer="live") as live:
                await until(lambda: live.statistics().owned != {}, 20, "live to own p0")
                await client.publish_many("orders", keyed(["k"], 0, 5))
                await until(lambda: journal.distinct() == 1, 10, "k:0 running")
                await until(lambda: live.statistics().held_for_order == 4, 10, "k:1..4 held")
                proxy.release()  # the held sweep reaches Redis now
                await asyncio.sleep(1.0)
                await client.publish_many("orders", keyed(["k"], 5, 10))
                gate.set()
                await until(lambda: journal.distinct() == 10, 20, "every message handled")
                await asyncio.sleep(6.0)  # what was taken comes back once idle
    wrong = regressions(journal)
    assert not wrong, (
        "a take-over sweep held in the network past its sender's lease took the live "
        f"owner's messages; the key went back after later messages were acked: {wrong}"
    )
