"""The per-node connection cap (``_node_gates``) when a master stops answering
(hung, or cut off by the network: a failover is coming, not a busy client).

README (Connections): a command beyond the cap "waits ... up to the socket
timeout ... for one to be free, then raises UnavailableError", whose message
says the cluster "is too busy for this client ... give the client fewer
concurrent subscribers and publishes, or a higher max_connections". When the
places are held by commands stuck on an unresponsive node, that advice is
wrong and hides the failing node; the issue asks for errors that say what to do.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import redis

import streamsub
from streamsub._backends.redis._cluster import RedisClusterBackend
from streamsub._backends.redis._keys import topic_key
from streamsub._backends.redis._slots import key_slot
from streamsub.testing import redis_cluster
from tests.cluster._helpers import owner_port


@pytest.mark.skipif(
    int(redis.__version__.split(".")[0]) < 6,
    reason="redis-py 5.0's cluster client reconnects to a SIGSTOPped node without end "
    "(its health-check PING times out on each new connection): README, Redis Cluster",
)
async def test_commands_queued_behind_a_hung_master_do_not_blame_a_busy_client(
    tmp_path: Path,
) -> None:
    # No replicas: a record on a hung master with a replica is read from the
    # replica (test_describe_during_failover.py); without one the lookups
    # queue at the hung master's places, as every command to it does.
    with redis_cluster(tmp_path, replicas=0) as cluster:
        backend = RedisClusterBackend(cluster.url, max_connections=2, socket_timeout=2.0)
        async with streamsub.connect(backend=backend) as client:
            victim_port = cluster.master_ports()[0]
            name = next(
                f"gate-{i}"
                for i in range(1000)
                if owner_port(cluster, key_slot(topic_key(f"gate-{i}"))) == victim_port
            )
            await client.create_topic(name, partitions=1)
            server = next(s for s in cluster.servers if s.port == victim_port)
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                results = await asyncio.gather(
                    *(client.get_topic(name) for _ in range(8)), return_exceptions=True
                )
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
        messages = [str(r) for r in results if isinstance(r, Exception)]
        assert messages, "every lookup succeeded on a hung master?"
        blamed = [m for m in messages if "fewer concurrent subscribers" in m or "too busy" in m]
        assert not blamed, (
            f"{len(blamed)} of {len(messages)} errors blame a busy client: {blamed[0]}"
        )
