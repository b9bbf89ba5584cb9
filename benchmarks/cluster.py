"""streamsub on a 3-master Redis Cluster against one redis-server, in one run.

Starts a private redis-server and a private cluster (3 masters, no replicas, so
that both do the same work per message; AOF off in both, as in run.py), and
for each: publishes ``--messages`` messages (keyed, 16 partitions) from this
process and times it; then times two subscribers in this process consuming
them all (end to end after the publish, so the figure is the read path);
then, with the subscriber idle, measures the latency of single messages
published every 100 ms and the commands per second an idle subscriber costs
the servers. Prints one table. Then, on the cluster, the read path alone, the
two ways a reader can cover partitions in different slots: one pipelined
non-blocking ``XREADGROUP`` per partition per round (what streamsub does) and
one blocking ``XREADGROUP`` per partition, each on its own connection. Takes
well under a minute on 2 cores.

    .venv/bin/python benchmarks/cluster.py --messages 48000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import redis

import streamsub
from streamsub.testing import redis_cluster, redis_server


def _cpu(clients: list[redis.Redis]) -> float:
    """CPU seconds the servers have used (user + system, all of them)."""
    total = 0.0
    for client in clients:
        info = client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def _calls(clients: list[redis.Redis]) -> int:
    total = 0
    for client in clients:
        for name, stats in client.info("commandstats").items():
            if name != "cmdstat_info":
                total += int(stats["calls"])
    return total


async def _measure(url: str, nodes: Callable[[], list[redis.Redis]], n: int) -> dict[str, Any]:
    async with streamsub.connect(url, trim_in_background=False) as client:
        await client.create_topic("bench", partitions=16)
        await client.create_subscription("bench-sub", topic="bench")
        messages = [
            streamsub.OutgoingMessage(data=b"x" * 100, ordering_key=f"k{i % 1000}")
            for i in range(n)
        ]
        servers = nodes()
        cpu = _cpu(servers)
        started = time.perf_counter()
        chunk = 1000
        await asyncio.gather(
            *(client.publish_many("bench", messages[i : i + chunk]) for i in range(0, n, chunk))
        )
        publish = n / (time.perf_counter() - started)
        publish_cpu = _cpu(servers) - cpu

        seen: set[str] = set()
        done = asyncio.Event()
        sent_at: dict[bytes, float] = {}
        latencies: list[float] = []

        async def handler(message: streamsub.Message) -> None:
            if message.data in sent_at:
                latencies.append(time.perf_counter() - sent_at[message.data])
                return
            seen.add(message.message_id)
            if len(seen) == n:
                done.set()

        cpu = _cpu(servers)
        started = time.perf_counter()
        async with (
            client.subscribe("bench-sub", handler, consumer="a"),
            client.subscribe("bench-sub", handler, consumer="b"),
        ):
            await asyncio.wait_for(done.wait(), 300)
            consume = n / (time.perf_counter() - started)
            consume_cpu = _cpu(servers) - cpu
            for server in servers:
                server.close()
            await asyncio.sleep(1.5)  # idle now
            servers = nodes()
            before, t0 = _calls(servers), time.perf_counter()
            await asyncio.sleep(5)
            idle = (_calls(servers) - before) / (time.perf_counter() - t0)
            for server in servers:
                server.close()
            for i in range(30):
                data = b"latency-%d" % i
                sent_at[data] = time.perf_counter()
                await client.publish("bench", data)
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
    latencies.sort()
    return {
        "publish": publish,
        "publish_per_cpu": n / publish_cpu,
        "consume_per_cpu": n / consume_cpu,
        "consume": consume,
        "idle_calls": idle,
        "latency_p50_ms": 1000 * statistics.median(latencies),
        "latency_max_ms": 1000 * latencies[-1],
    }


async def _read_paths(url: str, n: int) -> dict[str, float]:
    """Messages per second of each read design over ``n`` stored messages."""
    from redis.asyncio.cluster import RedisCluster

    async with streamsub.connect(url, trim_in_background=False) as client:
        await client.create_topic("readpath", partitions=16)
        for group in ("polls", "blocking"):
            await client.create_subscription(group, topic="readpath", start="earliest")
        messages = [
            streamsub.OutgoingMessage(data=b"x" * 100, ordering_key=f"k{i}") for i in range(n)
        ]
        for i in range(0, n, 2000):
            await client.publish_many("readpath", messages[i : i + 2000])
        record = await client._backend.get_topic("readpath")
        assert record is not None
        keys = client._backend._keys(record)  # type: ignore[attr-defined]
    cluster = RedisCluster.from_url(url.replace("redis+cluster://", "redis://").split(",")[0])
    await cluster.initialize()
    count = n // 16 // 50  # about what a reader with 1,000 messages free asks each partition

    async def polls() -> None:
        got = 0
        while got < n:
            async with cluster.pipeline() as pipe:
                for key in keys:
                    pipe.execute_command(
                        "XREADGROUP", "GROUP", "polls", "c", "COUNT", count, "STREAMS", key, ">",
                        target_nodes=cluster.get_node_from_key(key),
                    )  # fmt: skip
                got += sum(len(r[0][1]) for r in await pipe.execute() if r)

    async def blocking() -> None:
        got = 0
        done = asyncio.Event()

        async def one(key: str) -> None:
            nonlocal got
            while not done.is_set():
                reply = await cluster.execute_command(
                    "XREADGROUP", "GROUP", "blocking", "c", "COUNT", count, "BLOCK", 200,
                    "STREAMS", key, ">", target_nodes=cluster.get_node_from_key(key),
                )  # fmt: skip
                got += len(reply[0][1]) if reply else 0
                if got >= n:
                    done.set()

        await asyncio.gather(*(one(key) for key in keys))

    rates = {}
    for name, read in (("polls", polls), ("blocking", blocking)):
        started = time.perf_counter()
        await read()
        rates[name] = n / (time.perf_counter() - started)
    rates["connections"] = sum(len(node._connections) for node in cluster.get_nodes())
    await cluster.aclose()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=48_000)
    args = parser.parse_args()
    off = ("--appendonly", "no")
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        with redis_server(f"{directory}/one", extra_args=off) as one:
            port = one.port
            result = asyncio.run(_measure(one.url, lambda: [redis.Redis(port=port)], args.messages))
            rows.append(("standalone", result))
        with redis_cluster(f"{directory}/cluster", replicas=0, extra_args=off) as cluster:
            result = asyncio.run(
                _measure(
                    cluster.url,
                    lambda: [redis.Redis(port=p) for p in cluster.master_ports()],
                    args.messages,
                )
            )
            rows.append(("cluster (3 masters)", result))
            reads = asyncio.run(_read_paths(cluster.url, args.messages))
    print(f"{args.messages} messages of 100 B, 16 partitions, 1000 keys; two subscribers")
    print(
        "| server | publish msgs/s | consume msgs/s | server CPU: msgs published / "
        "consumed per CPU-second | idle commands/s | latency p50 | max |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {r['publish']:,.0f} | {r['consume']:,.0f} "
            f"| {r['publish_per_cpu']:,.0f} / {r['consume_per_cpu']:,.0f} | {r['idle_calls']:,.0f} "
            f"| {r['latency_p50_ms']:.1f} ms | {r['latency_max_ms']:.1f} ms |"
        )
    print()
    print("read path on the cluster, 16 partitions, one reader, messages already stored:")
    print(f"- pipelined polls per node: {reads['polls']:,.0f} msgs/s")
    print(
        f"- one blocking XREADGROUP per partition: {reads['blocking']:,.0f} msgs/s "
        f"({reads['connections']:.0f} connections open after both)"
    )


if __name__ == "__main__":
    main()
