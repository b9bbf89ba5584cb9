"""An owner's read request held in the network past its lease: Redis serves a
partition's reads only under its current owner's fencing token (fence.lua,
read_owned.lua), so the held read takes nothing once it arrives."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._delaying_proxy import DelayingProxy
from tests.ordered_faults._keys import Journal, keyed, ordered

# Behind a TCP proxy in front of one redis-server.
pytestmark = pytest.mark.standalone

KEYS = 20


async def _owners(client: streamsub.Client) -> dict[int, str]:
    stats = await client.subscription_stats("billing")
    return {p: owner for p, (owner, _) in stats.owners.items()}


@pytest.mark.timeout(90)
async def test_reads_a_silent_owner_sent_before_losing_its_partitions_do_not_break_order(
    client: streamsub.Client, server: RedisServer
) -> None:
    """An ordered subscription of 2 partitions, 20 keys, owned by a subscriber
    behind a proxy. The network starts holding what it sends (as TCP does, the
    bytes are delivered once it heals, even after the client gave up; see
    _delaying_proxy.py): its read, sent while its lease surely held, times out
    (3-s socket timeout), and so do its renewals. A second subscriber joins,
    takes both partitions over when the lease ends (10 s) and works through a
    backlog; then the network heals and the held requests reach Redis. Every
    message is handled, and each key's first handlings must be in publish order
    (issue 7: order while subscribers come and go)."""
    await ordered(client, partitions=2, ack_deadline=5.0)
    proxy = DelayingProxy()
    port = await proxy.start(server.port)
    keys = [f"key-{k}" for k in range(KEYS)]
    journal = Journal()

    async def owned_by(who: str) -> bool:
        owners = await _owners(client)
        return len(owners) == 2 and set(owners.values()) == {who}

    async def wait_owned_by(who: str, timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await owned_by(who):
            assert asyncio.get_running_loop().time() < deadline, f"{who} never owned both"
            await asyncio.sleep(0.1)

    async with (
        contextlib.aclosing(proxy),
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=3.0, trim_in_background=False
        ) as behind_proxy,
        behind_proxy.subscribe("billing", journal.handler("silent", 0.001), consumer="silent"),
    ):
        await wait_owned_by("silent", 20)
        await client.publish_many("orders", keyed(keys, 0, 5))
        await until(lambda: journal.distinct() == KEYS * 5, 20, "five rounds handled")
        proxy.hold()
        slow = streamsub.FlowControl(max_messages=5)
        async with client.subscribe(
            "billing", journal.handler("live", 0.02), consumer="live", flow_control=slow
        ):
            await wait_owned_by("live", 30)
            await client.publish_many("orders", keyed(keys, 5, 30))
            proxy.release()
            await until(lambda: journal.distinct() == KEYS * 30, 45, "every message")
    wrong = journal.out_of_order(30)
    assert not wrong, f"keys handled out of publish order after the network came back: {wrong}"
