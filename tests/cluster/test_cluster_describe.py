"""``streamsub topic describe`` on a real Redis Cluster: the master (address and
node id) that holds each partition, as the cluster says now."""

from __future__ import annotations

import collections
import json

from typer.testing import CliRunner

from streamsub._backends.redis import _keys
from streamsub.cli import NODE_ID_SHOWN, app
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import failover


def _cli(url: str, *args: str) -> str:
    runner = CliRunner(env={"STREAMSUB_URL": url, "COLUMNS": "300"})
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _holders(cluster: RedisClusterServers, topic: str) -> list[tuple[str, str]]:
    """Per partition, the (host:port, node id) of the master that has the
    partition's stream in its own keyspace, asked of every master."""
    inspect = cluster.client()
    try:
        salts = [int(s) for s in inspect.hget(_keys.topic_key(topic), "salts").split()]
        streams = [_keys.stream_key(_keys.partition_tag(topic, p, s)) for p, s in enumerate(salts)]
        slots = [inspect.keyslot(stream) for stream in streams]
    finally:
        inspect.close()
    holders: dict[str, tuple[str, str]] = {}
    for port in cluster.master_ports():
        node = cluster.node(port)
        try:
            node_id = node.execute_command("CLUSTER", "MYID").decode()
            for stream, slot in zip(streams, slots, strict=True):
                if stream.encode() in node.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                    holders[stream] = (f"127.0.0.1:{port}", node_id)
        finally:
            node.close()
    return [holders[stream] for stream in streams]


def test_topic_describe_names_the_master_of_each_partition_and_follows_a_failover(
    emptied: RedisClusterServers,
) -> None:
    """describe --json places each of a 16-partition topic's partitions on the
    master that holds its stream (address and node id), 5 or 6 per master, and
    the text table shows each master with its short node id and partitions;
    after a failover of partition 0's master, describe names the new master."""
    url = emptied.url
    _cli(url, "topic", "create", "placed", "--partitions", "16")
    described = json.loads(_cli(url, "topic", "describe", "placed", "--json"))
    holders = _holders(emptied, "placed")
    assert [(p["address"], p["node_id"]) for p in described["placement"]] == holders
    assert [p["partition"] for p in described["placement"]] == list(range(16))
    counts = collections.Counter(address for address, _ in holders)
    assert sorted(counts) == sorted(f"127.0.0.1:{p}" for p in emptied.master_ports())
    assert sorted(counts.values()) == [5, 5, 6]

    text = _cli(url, "topic", "describe", "placed")
    rows = {
        cells[0]: cells[1:]
        for line in text.splitlines()
        if line.startswith("│ 127.0.0.1:")
        for cells in [[cell.strip() for cell in line.strip("│ ").split("│")]]
    }
    for address, node_id in set(holders):
        short, partitions, count = rows[address]
        assert short == node_id[:NODE_ID_SHOWN]
        mine = [p for p, (holder, _) in enumerate(holders) if holder == address]
        assert count == str(len(mine))
        listed = [
            n
            for part in partitions.split(", ")
            for first, _, last in [part.partition("-")]
            for n in range(int(first), int(last or first) + 1)
        ]
        assert listed == mine

    inspect = emptied.client()
    try:
        salt = int(inspect.hget(_keys.topic_key("placed"), "salts").split()[0])
        slot = inspect.keyslot(_keys.stream_key(_keys.partition_tag("placed", 0, salt)))
    finally:
        inspect.close()
    struck = failover(emptied, slot)
    old, new = struck.old, struck.new
    moved = json.loads(_cli(url, "topic", "describe", "placed", "--json"))["placement"]
    assert moved[0]["address"] == f"127.0.0.1:{new}" != f"127.0.0.1:{old}"
    assert [(p["address"], p["node_id"]) for p in moved] == _holders(emptied, "placed")
