"""A partition's fence is a key of its own (ss:{tag}:fence:<subscription>, no
expiry). delete_subscription deletes the fences it finds; but fence.lua, unlike
own.lua since this change ("a member of a deleted subscription writes no
ownership records back"), writes its key whether or not the subscription still
exists. A fence request that reaches Redis after the delete -- sent by a
subscriber that had just taken a partition, held in the network -- leaves a
key behind for good."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._delaying_proxy import DelayingProxy
from tests.ordered_faults._keys import ordered

# Behind a TCP proxy in front of one redis-server.
pytestmark = pytest.mark.standalone


@pytest.mark.timeout(60)
async def test_a_late_fence_leaves_a_key_of_a_deleted_subscription_behind(
    client: streamsub.Client,
    server: RedisServer,
    redis_client: redis.Redis,
    short_ownership_lease: float,
) -> None:
    """A subscriber takes the partitions of an ordered subscription; the network
    holds its bytes just as its fence request goes out. The subscription is
    deleted meanwhile; the network heals; the subscriber stops (it finds the
    subscription gone). No key of the deleted subscription may remain."""
    await ordered(client, partitions=2)
    proxy = DelayingProxy()
    port = await proxy.start(server.port)
    async with (
        contextlib.aclosing(proxy),
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=30.0, trim_in_background=False
        ) as behind_proxy,
    ):
        backend = behind_proxy._backend
        real_fence = backend.fence
        held = asyncio.Event()

        async def fence(*args: Any, **kwargs: Any) -> Any:
            if not held.is_set():
                held.set()
                proxy.hold()  # the network stalls just as the fence request is sent
            return await real_fence(*args, **kwargs)

        backend.fence = fence  # type: ignore[method-assign]
        subscriber = behind_proxy.subscribe("billing", lambda m: None, consumer="late")
        with contextlib.suppress(streamsub.NotFoundError):  # it stops: the subscription is gone
            async with subscriber:
                await until(held.is_set, 20, "the fence request")
                await client.delete_subscription("billing")
                assert not list(redis_client.scan_iter("*fence*")), "deleted at once"
                proxy.release()
                with contextlib.suppress(streamsub.NotFoundError, TimeoutError):
                    await asyncio.wait_for(subscriber.wait(), 3 * short_ownership_lease)
    await asyncio.sleep(0.5)
    left = sorted(k.decode() for k in redis_client.scan_iter("*billing*"))
    assert left == [], f"keys of the deleted subscription 'billing' left behind: {left}"
