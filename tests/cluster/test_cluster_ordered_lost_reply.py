"""An ordered subscription's read whose reply is lost with its connection, on a
Redis Cluster (issue 9, "Done when": the ordering tests on a cluster; What to
build 3: a closed socket is retried). The server ran the fenced read
(read_owned.lua: XREADGROUP ``>``), so its entries are pending for the
subscriber, unseen. The reader's rule (``_engine/reader.py``): a read whose
outcome is unknown is followed by taking back what is pending there before
reading on, so that no later message of those keys overtakes them; a read
sent again silently after the reset hides that its outcome was unknown."""

from __future__ import annotations

import pytest

from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import owner_port, partition_slot
from tests.ordered_faults._lost_reply import first_handlings_after_a_lost_reply


@pytest.mark.timeout(90)
async def test_a_read_reply_lost_with_its_connection_lets_no_later_message_of_its_keys_overtake(
    emptied: RedisClusterServers,
) -> None:
    """See ``first_handlings_after_a_lost_reply`` (the partition's master drops
    the reply of the read that takes a 200 KB message): every message is
    handled, and each key's first handlings are in publish order."""
    cluster = emptied
    order = await first_handlings_after_a_lost_reply(
        cluster.url, lambda: cluster.node(owner_port(cluster, partition_slot(cluster, "lost", 0)))
    )
    wrong = {key: ns for key, ns in order.items() if ns != sorted(ns)}
    assert not wrong, f"later messages overtook a message whose read reply was lost: {wrong}"
