"""Durability's timeout under the group commit of waits.

Durability's docstring and README: "If fewer copies confirm within
``timeout`` seconds (default 5), the publish raises UnavailableError". With at
most one WAIT outstanding per connection, a batch sent while one is outstanding
waits for that one to answer (up to ``timeout``), then for its own (``timeout``
again): a publish made while the replicas are gone takes twice the timeout to
fail. The failover Done-when bounds the stall by the failover "plus a bounded
retry"; here the bound the user set is not kept.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import streamsub
from streamsub.testing import RedisServer


@pytest.mark.standalone  # a private server without replicas
async def test_a_publish_with_too_few_replicas_fails_within_the_durability_timeout(
    private_server: RedisServer,
) -> None:
    """A server with no replica: every WAIT 1 runs its full timeout (3 s).
    A first publish, and a second 0.3 s later on the same partition: each must
    raise UnavailableError within about 3 s of its call (not after the first's
    WAIT and then its own, 5.7 s)."""
    timeout = 3.0
    durability = streamsub.Durability(replicas=1, timeout=timeout)
    async with streamsub.connect(private_server.url, durability=durability) as client:
        await client.create_topic("dur", partitions=1)

        async def timed(data: bytes) -> float:
            started = time.monotonic()
            with pytest.raises(streamsub.UnavailableError):
                await client.publish("dur", data)
            return time.monotonic() - started

        first = asyncio.create_task(timed(b"1"))
        await asyncio.sleep(0.3)
        second = await timed(b"2")
        await first
    # Half a timeout of room for a busy machine; waiting behind the first's WAIT
    # would cost nearly a whole one more.
    assert second < 1.5 * timeout, (
        f"the second publish failed after {second:.1f} s, Durability.timeout is {timeout} s"
    )
