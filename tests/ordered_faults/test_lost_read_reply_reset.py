"""An ordered read whose reply is lost with its connection (a reset after the
server ran it), on one redis-server: the standalone twin of
tests/cluster/test_cluster_ordered_lost_reply.py. redis-py's connection retry
(one silent resend on ConnectionError, set in RedisBackend._open) sent the
read again, which read the keys' later entries; the reader never learned the
first read's outcome was unknown and did not take back what it left pending.
Ordered reads are now sent once (RedisBackend._routed, resend=False)."""

from __future__ import annotations

import pytest
import redis

from streamsub._server import RedisServer
from tests.ordered_faults._lost_reply import first_handlings_after_a_lost_reply

# A server of the test's own: the test changes its client-output-buffer-limit.
pytestmark = pytest.mark.standalone


@pytest.mark.timeout(90)
async def test_a_read_reply_lost_with_its_connection_lets_no_later_message_of_its_keys_overtake(
    private_server: RedisServer,
) -> None:
    """See ``first_handlings_after_a_lost_reply``: every message is handled, and
    each key's first handlings are in publish order."""
    order = await first_handlings_after_a_lost_reply(
        private_server.url, lambda: redis.Redis.from_url(private_server.url)
    )
    wrong = {key: ns for key, ns in order.items() if ns != sorted(ns)}
    assert not wrong, f"later messages overtook a message whose read reply was lost: {wrong}"
