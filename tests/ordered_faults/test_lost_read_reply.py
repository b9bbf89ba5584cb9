"""A read whose reply is lost (the server ran XREADGROUP, the reply never came:
a socket timeout, a reset after the server answered) on an ordered subscription.

The entries it delivered sit in the subscriber's pending list, unknown to it;
its next read asks for ``>`` and gets the keys' later messages. Nothing makes
those wait for the lost ones, which come back only after a whole ack deadline
idle, through a sweep: each key's order is broken."""

from __future__ import annotations

import asyncio

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._proxy import Proxy
from tests._wait import until
from tests.ordered_faults._keys import Journal, keyed, ordered

# Standalone: a TCP proxy stands between a subscriber and the one server (a cluster client
# connects to each node's own address).
pytestmark = pytest.mark.standalone

KEYS = 20
ROUNDS = 60


@pytest.mark.timeout(90)
async def test_a_read_reply_lost_on_the_way_back_does_not_let_later_messages_of_its_keys_overtake(
    client: streamsub.Client, server: RedisServer, redis_client: redis.Redis, proxy: Proxy
) -> None:
    """An ordered subscriber reads through a proxy while 20 keys are published
    steadily; for 4 s the proxy holds every reply (requests still reach Redis),
    past the subscriber's 3-s socket timeout, so the reads under way then are
    run by Redis and their replies lost. Every message is then handled, and each
    key's first handlings must still be in publish order (README: "a subscriber
    runs one message of an ordering key at a time, in publish order")."""
    await ordered(client, partitions=2, ack_deadline=6.0)
    port = await proxy.start("127.0.0.1", server.port)
    keys = [f"key-{k}" for k in range(KEYS)]
    journal = Journal()

    async def handler(message: streamsub.Message) -> None:
        journal.enter(message)
        await asyncio.sleep(0.001)
        journal.leave(message)

    async def publish() -> None:
        for n in range(ROUNDS):
            await client.publish_many("orders", keyed(keys, n, n + 1))
            await asyncio.sleep(0.1)

    async with (
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=3.0, trim_in_background=False
        ) as behind_proxy,
        behind_proxy.subscribe("billing", handler, consumer="s"),
    ):
        publishing = asyncio.create_task(publish())
        await until(lambda: journal.distinct() >= KEYS * 10, 30, "ten rounds handled")
        proxy.silence_replies()
        await asyncio.sleep(4.0)
        proxy.resume()
        await publishing
        await until(lambda: journal.distinct() == KEYS * ROUNDS, 45, "every message handled")
    wrong = journal.out_of_order(ROUNDS)
    assert not wrong, f"keys handled out of publish order after a lost read reply: {wrong}"
