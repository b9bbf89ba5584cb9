"""Reader.run: after a read whose outcome is unknown (a timeout, a reset), the
reader "takes back everything pending" in the partitions that read named
(Reclaimer.recover: min-idle 0, unfenced) before it reads again. It waits only
until it owns *some* partition (Assignment.wait), then recovers every partition
of the failed read, whether it still owns it or not. A subscriber whose network
failed for longer than its lease comes back owning one of its two partitions:
its recover sweep takes the pending messages of the other -- the live owner's,
running and held -- with no network delay needed at all."""

from __future__ import annotations

import asyncio

import pytest

import streamsub
from streamsub.testing import RedisServer
from tests._proxy import Proxy
from tests._wait import until
from tests.ordered_faults._keys import Journal, index, keyed, ordered
from tests.ordered_faults._order import record_unowned_sweeps, regressions

# Behind a TCP proxy in front of one redis-server.
pytestmark = pytest.mark.standalone

KEYS = [f"k{i}" for i in range(8)]


@pytest.mark.timeout(90)
async def test_recovering_after_a_failed_read_sweeps_a_partition_that_is_another_subscribers(
    client: streamsub.Client, server: RedisServer, proxy: Proxy, short_ownership_lease: float
) -> None:
    """Two partitions, eight keys. "former" (behind tests/_proxy.py) owns both; its
    network goes silent while a read is out, so the read times out (outcome
    unknown) and the lease (2 s) runs out. "live" takes both partitions, runs
    each key's first message (held open) and holds the next four. The network
    comes back; former is due one partition and live hands one back (its
    held-open handlers there return). As soon as former owns that one, it
    "recovers" both partitions of its failed read. Asserted: former sweeps no
    partition it does not own; and the key order of live's partition."""
    await ordered(client, partitions=2, ack_deadline=2.0)
    port = await proxy.start("127.0.0.1", server.port)
    journal = Journal()
    gates = {0: asyncio.Event(), 1: asyncio.Event()}
    foreign: list[tuple[list[int], dict[int, int], int, bool]] = []

    async def live_handle(message: streamsub.Message) -> None:
        journal.enter(message, "live")
        if index(message) == 0 and message.delivery_attempt == 1:
            await gates[message._partition].wait()
        journal.leave(message)

    async def former_handle(message: streamsub.Message) -> None:
        journal.enter(message, "former")
        journal.leave(message)

    async with streamsub.connect(
        f"redis://127.0.0.1:{port}/0", socket_timeout=2.0, trim_in_background=False
    ) as behind_proxy:
        former = behind_proxy.subscribe("billing", former_handle, consumer="former")
        record_unowned_sweeps(
            behind_proxy,
            former,
            lambda args, kwargs, owned: foreign.append(
                (sorted(args[3]), owned, args[4], bool(kwargs.get("take_parked")))
            ),
        )
        async with former:
            await until(lambda: len(former.statistics().owned) == 2, 20, "former owns both")
            await asyncio.sleep(0.5)  # its reader waits in a read now
            proxy.silence()
            await asyncio.sleep(short_ownership_lease + 1.0)
            async with client.subscribe("billing", live_handle, consumer="live") as live:
                await until(lambda: len(live.statistics().owned) == 2, 20, "live owns both")
                await client.publish_many("orders", keyed(KEYS, 0, 5))
                await until(lambda: journal.distinct() == len(KEYS), 10, "each key's first")
                proxy.resume()
                live_owner = live._last._owner  # type: ignore[union-attr]
                assert live_owner is not None
                await until(lambda: bool(live_owner._handing_back), 20, "live to hand one back")
                given = sorted(live_owner._handing_back)[0]
                gates[given].set()
                await until(lambda: len(former.statistics().owned) == 1, 20, "former owns one")
                await asyncio.sleep(1.0)
                await client.publish_many("orders", keyed(KEYS, 5, 10))
                gates[1 - given].set()
                await until(lambda: journal.distinct() == 10 * len(KEYS), 30, "every message")
                await asyncio.sleep(6.0)  # what was taken comes back once idle
    wrong = regressions(journal)
    assert not foreign, (
        "former swept partitions it does not own (partitions, what it surely owned, "
        f"min-idle ms, take_parked): {foreign[:3]}; "
        f"keys whose handlings went back: {wrong or 'none'}"
    )
    assert not wrong, f"keys whose handlings went back after later messages were acked: {wrong}"
