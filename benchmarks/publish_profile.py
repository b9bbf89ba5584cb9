"""Where a publish's Python time goes: the publish paths in one process, timed or profiled.

Usage (from the repository root)::

    .venv/bin/python benchmarks/publish_profile.py                 # msgs/s, median of 5
    .venv/bin/python benchmarks/publish_profile.py --profile 30    # cProfile, top 30
    .venv/bin/python benchmarks/publish_profile.py --paths workers500,many1000

Paths: ``workers<N>`` (N callers, each awaiting ``publish()`` in a loop, as
``run.py --scenarios workers``), ``many<K>`` (``publish_many`` of K, calls one
after the other, as ``--scenarios many``) and ``pipelined`` (the hand-written
loop: ``XADD`` pipelined 200 at a time), 100-byte messages on a 16-partition
topic, against one private redis-server. In-process and single-threaded, so
the figures say where this process's time goes; ``run.py`` gives the ratios.
Besides msgs/s (noisy on a shared machine) it prints the CPU time per message
of this process and of the redis-server (``INFO cpu``), which other load
disturbs far less.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
for entry in (str(BENCH_DIR), str(BENCH_DIR.parent / "src")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import redis.asyncio as aioredis  # noqa: E402

import servers  # noqa: E402
import streamsub  # noqa: E402

BODY = b"x" * 100
TOPIC = "bench"


async def workers(client: streamsub.Client, n: int, count: int) -> None:
    sequence = iter(range(n))

    async def worker() -> None:
        for _ in sequence:
            await client.publish(TOPIC, BODY)

    await asyncio.gather(*(worker() for _ in range(count)))


async def many(client: streamsub.Client, n: int, per_call: int) -> None:
    for base in range(0, n, per_call):
        chunk = [streamsub.OutgoingMessage(data=BODY) for _ in range(min(per_call, n - base))]
        await client.publish_many(TOPIC, chunk)


async def pipelined(url: str, n: int) -> None:
    redis = aioredis.Redis.from_url(url)
    try:
        for base in range(0, n, 200):
            pipe = redis.pipeline(transaction=False)
            for _ in range(min(200, n - base)):
                pipe.xadd(TOPIC, {b"d": BODY})
            await pipe.execute()
    finally:
        await redis.aclose()


async def server_cpu(url: str) -> float:
    """Seconds of CPU the redis-server has used (user and system)."""
    redis = aioredis.Redis.from_url(url)
    try:
        info = await redis.info("cpu")
    finally:
        await redis.aclose()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def one_round(
    url: str, path: str, n: int, profiler: cProfile.Profile | None
) -> tuple[float, float, float]:
    """msgs/s, and this process's and the server's CPU µs per message."""
    redis = aioredis.Redis.from_url(url)
    await redis.flushall()
    await redis.aclose()
    async with streamsub.connect(url) as client:
        await client.create_topic(TOPIC, partitions=16)
        await client.publish_many(TOPIC, [BODY] * 20)  # connections and scripts warm
        server_before = await server_cpu(url)
        cpu = time.process_time()
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        if path.startswith("workers"):
            await workers(client, n, int(path.removeprefix("workers")))
        elif path.startswith("many"):
            await many(client, n, int(path.removeprefix("many")))
        else:
            await pipelined(url, n)
        if profiler is not None:
            profiler.disable()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        server = await server_cpu(url) - server_before
        return n / elapsed, cpu * 1e6 / n, server * 1e6 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default="workers500,many100,many1000,many10000,pipelined")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, metavar="TOP", help="profile one round instead")
    parser.add_argument("--sort", default="tottime")
    args = parser.parse_args()
    redis_path = servers.find_binary("redis-server")
    if redis_path is None:
        sys.exit("redis-server not found")
    with servers.redis_server(redis_path) as url:
        for path in args.paths.split(","):
            if args.profile:
                profiler = cProfile.Profile()
                rate, _, _ = asyncio.run(one_round(url, path, args.messages, profiler))
                print(f"== {path}: {rate:,.0f} msgs/s under cProfile")
                stats = pstats.Stats(profiler)
                stats.sort_stats(args.sort).print_stats(args.profile)
                continue
            results = [
                asyncio.run(one_round(url, path, args.messages, None)) for _ in range(args.rounds)
            ]
            rates = [rate for rate, _, _ in results]
            client_cpu = statistics.median(cpu for _, cpu, _ in results)
            server = statistics.median(server for _, _, server in results)
            print(
                f"{path:>12}: median {statistics.median(rates):>9,.0f} msgs/s; CPU per "
                f"message: this process {client_cpu:5.2f} µs, redis-server {server:5.2f} µs; "
                "rounds " + " ".join(f"{rate:,.0f}" for rate in rates),
                flush=True,
            )


if __name__ == "__main__":
    main()
