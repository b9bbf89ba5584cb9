"""The ack of a handler that ran past its subscriber's lost lease.

README (Partition ownership): "A handler already running when the lease ran
out finishes, but its ack or nack settles nothing once the new owner has taken
the message over (settling checks the delivery)". Nacks check the consumer and
the delivery count (nack.lua); a plain ack is an XACK of the entry, whoever
holds it now."""

from __future__ import annotations

import asyncio

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._proxy import Proxy
from tests._wait import until
from tests.ordered_faults._keys import Journal, index, keyed, ordered

# Standalone: a TCP proxy stands between a subscriber and the one server (a cluster client
# connects to each node's own address).
pytestmark = pytest.mark.standalone


@pytest.mark.timeout(60)
async def test_a_deposed_owners_late_ack_does_not_settle_the_new_owners_delivery(
    client: streamsub.Client,
    server: RedisServer,
    redis_client: redis.Redis,
    proxy: Proxy,
    short_ownership_lease: float,
) -> None:
    """m runs k:0 while its network goes silent; x takes the partition over and
    k:0 with it (delivery 2), whose handler fails: nacked with a 30-s backoff, k:0
    waits in the delay set, still pending. m's network comes back and its handler
    of k:0 returns, which acks. That late ack must settle nothing: k:0 stays
    pending for x's redelivery (delivery 3)."""
    await ordered(client, partitions=1, ack_deadline=5.0, backoff=30.0)
    port = await proxy.start("127.0.0.1", server.port)
    journal = Journal()
    release = asyncio.Event()

    async def slow(message: streamsub.Message) -> None:
        journal.enter(message, "m")
        if index(message) == 0:
            await release.wait()
        journal.leave(message)

    async def failing(message: streamsub.Message) -> None:
        journal.enter(message, "x")
        journal.leave(message)
        if index(message) == 0:
            raise RuntimeError("x's handling of k:0 fails")

    async with (
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=3.0, trim_in_background=False
        ) as behind_proxy,
        behind_proxy.subscribe("billing", slow, consumer="m") as m,
    ):
        await until(lambda: m.statistics().partitions == (0,), 15, "m to own the partition")
        await client.publish_many("orders", keyed(["k"], 0, 3))
        await until(lambda: bool(journal.records), 15, "m to run k:0")
        proxy.silence()
        async with client.subscribe("billing", failing, consumer="x"):
            await until(
                lambda: ("k", 0, 2, "x") in journal.records, 20, "x to take k:0 over and fail it"
            )
            entry_id = redis_client.xrange("ss:{orders.0}", count=1)[0][0]
            pending = redis_client.xpending_range("ss:{orders.0}", "billing", entry_id, entry_id, 1)
            assert pending, "x's nack did not keep k:0 pending"
            proxy.resume()
            release.set()
            await until(lambda: m.statistics().acked == 1, 10, "m's handler to ack")
            await asyncio.sleep(4.0)  # m's settler sends it (retrying at most 2 s apart)
            pending = redis_client.xpending_range("ss:{orders.0}", "billing", entry_id, entry_id, 1)
    assert pending, "m's late ack settled k:0, which x had taken over and nacked"
