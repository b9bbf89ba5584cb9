"""The private Redis Cluster that the cluster tests run on."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from streamsub._cluster_server import _free_port_pair
from streamsub.testing import RedisClusterServers, redis_cluster


def test_cluster_serves_every_slot_from_three_masters_with_synced_replicas(
    cluster: RedisClusterServers,
) -> None:
    """Three masters split the slots evenly; every master has a replica that
    holds what was written to it."""
    client = cluster.client()
    keys = [f"fixture-{i}" for i in range(300)]
    try:
        served: dict[int, list[tuple[int, int]]] = {}
        for (first, last), info in client.cluster_slots().items():
            served.setdefault(info["primary"][1], []).append((first, last))
        assert sorted(served) == cluster.master_ports()
        sizes = [sum(b - a + 1 for a, b in ranges) for ranges in served.values()]
        assert sum(sizes) == 16384
        assert max(sizes) - min(sizes) <= 1
        for key in keys:
            client.set(key, key)
        replica_of = {}
        for port in set(cluster.ports) - set(served):
            node = cluster.node(port)
            replica_of[int(node.info("replication")["master_port"])] = node
        assert sorted(replica_of) == sorted(served)
        for port, ranges in served.items():
            primary = cluster.node(port)
            assert primary.wait(1, 5000) == 1
            primary.close()
            mine = [k for k in keys if any(a <= client.keyslot(k) <= b for a, b in ranges)]
            assert mine
            replica = replica_of[port]
            replica.execute_command("READONLY")
            assert [replica.get(k) for k in mine] == [k.encode() for k in mine]
            replica.close()
    finally:
        client.delete(*keys)
        client.close()


def test_two_nodes_never_get_one_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports are picked at random before any node starts: a pick repeated for a
    second node is picked again, not started (its PING would be answered by
    the first node, and the cluster built of one node twice: "Node config
    epoch is already non-zero", as a CI run once failed)."""
    real = random.randrange
    repeated = _free_port_pair()
    picks = iter([repeated, repeated])
    monkeypatch.setattr(random, "randrange", lambda *args: next(picks, None) or real(*args))
    with redis_cluster(tmp_path, masters=2, replicas=0) as cluster:
        assert len(set(cluster.ports)) == 2
        assert repeated in cluster.ports
        client = cluster.client()
        try:
            assert len({info["primary"][1] for info in client.cluster_slots().values()}) == 2
        finally:
            client.close()


def test_ports_and_bus_ports_are_below_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from 32768 up (the kernel's
    default ephemeral range), so a node's port or bus port there could be
    taken between its pick and its start. 300 picks: each pair below it, and
    none sharing a port with a pair picked before it."""
    taken: list[int] = []
    for _ in range(300):
        port = _free_port_pair(taken)
        assert port >= 1024, port
        assert port + 10000 < 32768, port
        earlier = set(taken) | {t + 10000 for t in taken}
        assert not {port, port + 10000} & earlier, port
        taken.append(port)
