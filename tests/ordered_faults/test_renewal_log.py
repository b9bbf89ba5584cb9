"""What the log says when an ordered subscriber cannot renew its partitions."""

from __future__ import annotations

import asyncio
import logging

import pytest

import streamsub
from streamsub.testing import RedisServer
from tests._proxy import Proxy
from tests._wait import until
from tests.ordered_faults._keys import ordered

# Standalone: a TCP proxy stands between a subscriber and the one server (a cluster client
# connects to each node's own address).
pytestmark = pytest.mark.standalone


@pytest.mark.timeout(30)
async def test_a_renewal_that_times_out_is_logged_with_its_reason(
    client: streamsub.Client,
    server: RedisServer,
    proxy: Proxy,
    short_ownership_lease: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A subscriber whose network goes silent logs its failed renewals; each line
    says why (a time-out, and what to check), as the other parts' lines do, not
    "keeping partition ownership failed ()" (STYLE: "messages say what to do
    next"; README: "one line per noteworthy event")."""
    caplog.set_level(logging.WARNING, logger="streamsub")
    await ordered(client, partitions=2)
    port = await proxy.start("127.0.0.1", server.port)
    async with (
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=3.0, trim_in_background=False
        ) as behind_proxy,
        behind_proxy.subscribe("billing", lambda m: None, consumer="s") as subscriber,
    ):
        await until(lambda: len(subscriber.statistics().owned) == 2, 15, "ownership")
        proxy.silence()
        await until(
            lambda: any("keeping partition ownership" in r.getMessage() for r in caplog.records),
            15,
            "a failed renewal in the log",
        )
        await asyncio.sleep(0.5)
        proxy.resume()
    lines = [
        r.getMessage() for r in caplog.records if "keeping partition ownership" in r.getMessage()
    ]
    assert all("failed ()" not in line for line in lines), lines
