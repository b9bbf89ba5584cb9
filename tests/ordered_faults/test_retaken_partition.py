"""An owner that lost a partition (its lease lapsed: a silent network) and gets it
back after another subscriber held it and let it go, all between two of its
renewals. The partition comes back under a new fencing token, but the owner
compares partitions, not tokens: it does not see a new ownership, so it does
not first take over what is pending there before it reads on."""

from __future__ import annotations

import pytest

import streamsub
from streamsub.testing import RedisServer
from tests._proxy import Proxy
from tests._wait import until
from tests.ordered_faults._keys import Journal, keyed, ordered

# Standalone: a TCP proxy stands between a subscriber and the one server (a cluster client
# connects to each node's own address).
pytestmark = pytest.mark.standalone


@pytest.mark.timeout(60)
async def test_an_owner_that_gets_its_partition_back_takes_over_what_is_pending_first(
    client: streamsub.Client, server: RedisServer, proxy: Proxy, short_ownership_lease: float
) -> None:
    """Subscriber m owns the one partition; its network goes silent. Subscriber x
    takes the partition over when m's lease ends, reads 5 of key k's 30 messages
    (max_messages=5), handles k:0 and stops gracefully, giving k:1..k:4 back
    unstarted and releasing the partition. m's network comes back and it owns
    the partition again, under a new token. k's first handlings must be in
    publish order (README: a new owner "first takes over every entry still
    pending there ... before any later message of its key"): m must take
    k:1..k:4 before it reads k:5 on."""
    await ordered(client, partitions=1, ack_deadline=30.0)
    port = await proxy.start("127.0.0.1", server.port)
    journal = Journal()

    async with (
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=3.0, trim_in_background=False
        ) as behind_proxy,
        behind_proxy.subscribe("billing", journal.handler("m", 0.001), consumer="m") as m,
    ):
        await until(lambda: m.statistics().partitions == (0,), 15, "m to own the partition")
        proxy.silence()
        slow = streamsub.FlowControl(max_messages=5)
        async with client.subscribe(
            "billing", journal.handler("x", 0.3), consumer="x", flow_control=slow
        ) as x:
            await until(lambda: x.statistics().partitions == (0,), 15, "x to take it over")
            await client.publish_many("orders", keyed(["k"], 0, 30))
            await until(lambda: x.statistics().flow.outstanding_messages == 5, 15, "x to hold 5")
        proxy.resume()
        await until(lambda: journal.distinct() == 30, 40, "every message of k")
        token_view = m.statistics().owned
    first = journal.first_handlings()["k"]
    assert first == list(range(30)), (
        f"k's first handlings: {first[:12]}... (m owns the partition again as {token_view})"
    )
