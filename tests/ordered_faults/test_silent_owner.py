"""An owner of an ordered subscription's partitions whose connection to Redis goes
silent (no reset: a cut cable, a dropped NAT entry), through tests/_proxy.py.

Another subscriber takes its partitions once its lease ends; the silent one
must not report them as its own meanwhile."""

from __future__ import annotations

import asyncio

import pytest

import streamsub
from streamsub.testing import RedisServer
from tests._proxy import Proxy
from tests._wait import until
from tests.ordered_faults._keys import ordered

# Standalone: a TCP proxy stands between a subscriber and the one server (a cluster client
# connects to each node's own address).
pytestmark = pytest.mark.standalone

KEYS = 20


async def _owners(client: streamsub.Client) -> dict[int, str]:
    stats = await client.subscription_stats("billing")
    return {p: owner for p, (owner, _) in stats.owners.items()}


@pytest.mark.timeout(60)
async def test_a_silent_owner_does_not_report_partitions_another_subscriber_took_over(
    client: streamsub.Client, server: RedisServer, proxy: Proxy, short_ownership_lease: float
) -> None:
    """Two subscribers share 4 partitions; one's network goes silent and the other
    takes all 4 over when its lease ends. From then on the silent one's
    statistics() must not say it owns any of them (README: "statistics().partitions
    / .owned and subscription_stats().owners ... show who owns what";
    ReceiverStatistics.owned: "the partitions this subscriber owns")."""
    await ordered(client, partitions=4)
    port = await proxy.start("127.0.0.1", server.port)
    async with (
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=3.0, trim_in_background=False
        ) as behind_proxy,
        behind_proxy.subscribe("billing", lambda m: None, consumer="silent") as silent,
        client.subscribe("billing", lambda m: None, consumer="live") as live,
    ):
        await until(
            lambda: len(silent.statistics().owned) == 2 and len(live.statistics().owned) == 2,
            20,
            "two partitions each",
        )
        proxy.silence()
        await until(lambda: len(live.statistics().owned) == 4, 30, "the live one to own all 4")
        assert set((await _owners(client)).values()) == {"live"}
        await asyncio.sleep(1.0)
        silent_view = silent.statistics()
        proxy.resume()
    assert silent_view.partitions == ()  # it reads nothing: that holds
    assert silent_view.owned == {}, (
        f"the silent subscriber still reports owning {silent_view.owned} while 'live' owns all four"
    )
