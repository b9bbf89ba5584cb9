"""The private Redis Cluster that the cluster tests run on."""

from __future__ import annotations

from streamsub.testing import RedisClusterServers


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
