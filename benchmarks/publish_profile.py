"""Where a publish's Python time goes: the publish paths in one process, timed or profiled.

Usage (from the repository root)::

    .venv/bin/python benchmarks/publish_profile.py                 # msgs/s, median of 5
    .venv/bin/python benchmarks/publish_profile.py --profile 30    # cProfile, top 30
    .venv/bin/python benchmarks/publish_profile.py --paths workers500,many1000
    .venv/bin/python benchmarks/publish_profile.py --steps         # µs per step, no Redis
    .venv/bin/python benchmarks/publish_profile.py --breakdown     # µs per message by step
    .venv/bin/python benchmarks/publish_profile.py --cluster       # on a 3-master cluster

Paths: ``each`` (one caller awaiting each ``publish()``; ``xadd``: one
redis-py ``XADD`` awaited each time instead), ``workers<N>`` (N
callers, each awaiting ``publish()`` in a loop, as
``run.py --scenarios workers``), ``many<K>`` (``publish_many`` of K, calls one
after the other, as ``--scenarios many``) and ``pipelined`` (the hand-written
loop: ``XADD`` pipelined 200 at a time), 100-byte messages on a 16-partition
topic, against one private redis-server. In-process and single-threaded, so
the figures say where this process's time goes; ``run.py`` gives the ratios.
Besides msgs/s (noisy on a shared machine) it prints the CPU time per message
of this process and of the redis-server (``INFO cpu``), which other load
disturbs far less.

``--cluster`` runs the same paths against a private Redis Cluster instead (3
masters, no replicas, AOF off, as ``run.py --cluster`` starts it); streamsub
connects with the cluster's ``redis+cluster://`` URL, and ``xadd`` and
``pipelined`` are the hand-written loop on a cluster
(``impls/handwritten.py``'s ``HandwrittenCluster``): ``redis.asyncio.RedisCluster``
and 16 streams spread 6/5/5 over the masters, message ``i`` to stream
``i % 16``, a pipeline split by node. The server's CPU per message is then
summed over the masters. ``--profile`` and ``--breakdown`` work the same way
there; the breakdown counts redis-py's cluster client and streamsub's routing
of a write by node as a step of its own.

``--steps`` times the steps of one awaited ``publish()`` and of ``publish_many``
one by one, in a loop each, without a server: the engine's publisher writes to
a backend that answers at once with made-up ids, so what is timed is Python
alone (encoding, queueing, a write's bookkeeping, resolving the callers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for entry in (str(BENCH_DIR), str(BENCH_DIR.parent / "src")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import servers  # noqa: E402
import streamsub  # noqa: E402
from impls.base import Env, redis_nodes  # noqa: E402
from impls.handwritten import FIELD, Handwritten, HandwrittenCluster  # noqa: E402

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


async def xadd(redis: Any, streams: list[str], n: int) -> None:
    for seq in range(n):
        await redis.xadd(streams[seq % len(streams)], {FIELD: BODY})


async def pipelined(redis: Any, streams: list[str], n: int) -> None:
    for base in range(0, n, 200):
        pipe = redis.pipeline(transaction=False)
        for seq in range(base, min(base + 200, n)):
            pipe.xadd(streams[seq % len(streams)], {FIELD: BODY})
        await pipe.execute()


@contextlib.asynccontextmanager
async def handwritten(url: str) -> AsyncIterator[tuple[Any, list[str]]]:
    """The hand-written loop's client and the streams it publishes to, as
    ``run.py`` runs it: a ``Redis`` and one stream on one server, a
    ``RedisCluster`` and 16 streams spread over the masters on a cluster; warm
    (a connection to each master, 20 ``XADD``s)."""
    env = Env(redis_url=url)
    impl = HandwrittenCluster(env) if env.cluster else Handwritten(env)
    async with impl.connection() as (redis, streams):
        await xadd(redis, streams, 20)
        yield redis, streams


async def server_cpu(url: str) -> float:
    """Seconds of CPU the redis-server, or every master of the cluster, has used
    (user and system)."""
    total = 0.0
    async with redis_nodes(url) as nodes:
        for node in nodes:
            info = await node.info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


async def one_round(
    url: str, path: str, n: int, profiler: cProfile.Profile | None
) -> tuple[float, float, float]:
    """msgs/s, and this process's and the server's CPU µs per message."""
    async with redis_nodes(url) as nodes:
        for node in nodes:
            await node.flushall()
    async with streamsub.connect(url) as client, contextlib.AsyncExitStack() as stack:
        await client.create_topic(TOPIC, partitions=16)
        for _ in range(20):  # connections and scripts warm
            await client.publish(TOPIC, BODY)
        redis: Any = None
        streams: list[str] = []
        if path in ("xadd", "pipelined"):
            redis, streams = await stack.enter_async_context(handwritten(url))
        server_before = await server_cpu(url)
        cpu = time.process_time()
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        if path == "xadd":  # the hand-written baseline of each
            await xadd(redis, streams, n)
        elif path == "each":
            for _ in range(n):
                await client.publish(TOPIC, BODY)
        elif path.startswith("workers"):
            await workers(client, n, int(path.removeprefix("workers")))
        elif path.startswith("many"):
            await many(client, n, int(path.removeprefix("many")))
        elif path == "pipelined":
            await pipelined(redis, streams, n)
        else:
            raise SystemExit(f"unknown path {path!r}")
        if profiler is not None:
            profiler.disable()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        server = await server_cpu(url) - server_before
        return n / elapsed, cpu * 1e6 / n, server * 1e6 / n


class _Answering:
    """A backend that stores nothing and answers each append at once with an id
    for each message (each one's data is ``BODY``, found once in the packed
    batch whichever way it is packed: on its own, or in a run of data alone)."""

    def __init__(self) -> None:
        self._ids = [f"1-{i}" for i in range(100_000)]

    async def append(self, topic: Any, batch: Any, links: Any = None) -> dict[int, list[str]]:
        return {p: self._ids[: blob.count(BODY)] for p, blob in batch.items()}

    def write_groups(self, topic: Any, partitions: Any) -> None:
        return None  # one server


async def _pool(n: int, workers: int, publish_one: Any) -> float:
    """µs of CPU per message for ``workers`` coroutines awaiting ``publish_one()``."""
    sequence = iter(range(n))

    async def worker() -> None:
        for _ in sequence:
            await publish_one()

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return (time.process_time() - started) * 1e6 / n


async def bare_futures(n: int, workers: int) -> None:
    """What any awaited call costs: ``workers`` coroutines awaiting n bare
    futures in all, which a task resolves once a loop iteration, as the
    publisher's writes do."""
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future[None]] = []
    done = False

    async def resolver() -> None:
        while not done:
            batch, pending[:] = list(pending), []
            for future in batch:
                future.set_result(None)
            await asyncio.sleep(0)

    def bare() -> asyncio.Future[None]:
        future = loop.create_future()
        pending.append(future)
        return future

    task = loop.create_task(resolver())
    sequence = iter(range(n))

    async def worker() -> None:
        for _ in sequence:
            await bare()

    await asyncio.gather(*(worker() for _ in range(workers)))
    done = True
    await task


async def steps(n: int) -> list[tuple[str, float]]:
    """µs of CPU per message of the publish paths and their steps, without a server."""
    # Imported here: the other modes also run against older code (PYTHONPATH).
    from streamsub import tracing
    from streamsub._backends.base import TopicRecord
    from streamsub._core.codec import encode, encode_data
    from streamsub._engine.publisher import TopicPublisher
    from streamsub._settings import BatchSettings

    max_bytes = 10 * 2**20
    topic = TopicRecord(TOPIC, 16, "", 0.0)
    encoded = encode(BODY, max_bytes=max_bytes)
    backend: Any = _Answering()
    found: list[tuple[str, float]] = []

    def timed(name: str, call: Any) -> None:
        started = time.process_time()
        for _ in range(n):
            call()
        found.append((name, (time.process_time() - started) * 1e6 / n))

    timed("encode()", lambda: encode(BODY, None, None, max_bytes=max_bytes))
    timed("encode_data()", lambda: encode_data(BODY, max_bytes))
    timed("tracing.active()", tracing.active)

    started = time.process_time()
    await bare_futures(n, 500)
    found.append(("500 workers awaiting bare futures", (time.process_time() - started) * 1e6 / n))

    publisher = TopicPublisher(backend, topic, BatchSettings())
    one = (encoded,)
    found.append(
        ("500 workers: TopicPublisher.publish", await _pool(n, 500, lambda: publisher.publish(one)))
    )
    await publisher.aclose()

    client = streamsub.connect("redis://127.0.0.1:1/0", backend=backend, trim_in_background=False)
    client._publishers[TOPIC] = TopicPublisher(
        backend, topic, BatchSettings(), gate=client._publish_gate
    )
    found.append(
        ("500 workers: Client.publish", await _pool(n, 500, lambda: client.publish(TOPIC, BODY)))
    )
    chunk = [BODY] * 1000
    started = time.process_time()
    for _ in range(n // 1000):
        await client.publish_many(TOPIC, chunk)
    found.append(("Client.publish_many(1000)", (time.process_time() - started) * 1e6 / n))
    await client._publishers[TOPIC].aclose()
    return found


_STEPS = (
    # (step, where: a path fragment, and function names or None for all of it)
    ("tracing and metrics hooks", "streamsub/tracing.py", None),
    ("tracing and metrics hooks", "streamsub/metrics.py", None),
    ("encoding", "streamsub/_core/codec.py", None),
    ("flow control", "streamsub/_core/publish_flow.py", None),
    ("flow control", "_engine/publisher.py", {"try_take", "acquire", "_refuse_over", "release"}),
    ("ordering-key gate", "_engine/publisher.py", {"_check_paused", "first_paused", "<genexpr>"}),
    ("future and waiter", "_engine/publisher.py", {"__init__"}),
    ("future and waiter", "asyncio/base_events.py", {"create_future"}),
    ("batcher and queueing", "streamsub/_core/batch.py", None),
    ("batcher and queueing", "streamsub/_core/partition.py", None),
    (
        "batcher and queueing",
        "_engine/publisher.py",
        {"submit", "publish", "_enqueue", "_enqueue_runs", "_partition", "_close_batch"},
    ),
    ("client publish()/publish_many()", "streamsub/_client.py", None),
    ("client publish()/publish_many()", "streamsub/_message.py", None),
    ("write: links, EVAL argument packing", "_engine/publisher.py", {"_links", "_flush", "_run"}),
    ("write: links, EVAL argument packing", "redis/asyncio/connection.py", {"pack_command"}),
    ("write: links, EVAL argument packing", "redis/asyncio/connection.py", {"pack_commands"}),
    ("write: links, EVAL argument packing", "redis/_parsers/encoders.py", None),
    # On a cluster: finding each command's node and splitting a write by node.
    ("cluster: routing by slot and node", "_backends/redis/_cluster.py", None),
    ("cluster: routing by slot and node", "_backends/redis/_routing.py", None),
    ("cluster: routing by slot and node", "_backends/redis/_slots.py", None),
    ("cluster: routing by slot and node", "_backends/redis/_node_gates.py", None),
    ("cluster: routing by slot and node", "redis/asyncio/cluster.py", None),
    ("cluster: routing by slot and node", "redis/cluster.py", None),
    ("cluster: routing by slot and node", "redis/crc.py", None),
    ("cluster: routing by slot and node", "redis/_parsers/commands.py", None),  # a command's keys
    ("reply handling: ids, resolving callers", "_engine/publisher.py", None),
    ("reply handling: ids, resolving callers", "_backends/redis", None),
    ("reply handling: ids, resolving callers", "redis/", None),
    ("reply handling: ids, resolving callers", "<method 'set_result'", None),
    ("reply handling: ids, resolving callers", "<method 'decode'", None),
    ("reply handling: ids, resolving callers", "<method 'split'", None),
    ("socket and epoll system calls", "<method 'send' of", None),
    ("socket and epoll system calls", "<method 'recv", None),
    ("socket and epoll system calls", "<method 'poll'", None),
    ("event loop: task wake-ups", "asyncio/", None),
    ("event loop: task wake-ups", "<method 'run' of '_contextvars", None),
    ("event loop: task wake-ups", "selectors.py", None),
    ("benchmark's own loop", "publish_profile.py", None),
)


def _step(filename: str, function: str) -> str:
    where = filename if filename != "~" else function
    for step, fragment, functions in _STEPS:
        if fragment in where and (functions is None or function in functions):
            return step
    return _OTHER


_OTHER = "other"


def breakdown(url: str, path: str, n: int) -> None:
    """µs of CPU per message by step: a cProfile of one round, its shares scaled
    to the CPU per message of an unprofiled round (the profiler slows small
    Python calls more than C ones: the shares are approximate)."""
    _, cpu, server = asyncio.run(one_round(url, path, n, None))
    profiler = cProfile.Profile(time.process_time)  # CPU, not time spent waiting
    asyncio.run(one_round(url, path, n, profiler))
    stats: Any = pstats.Stats(profiler)
    steps: dict[str, float] = {}
    for (filename, _, function), (_, _, tottime, _, callers) in stats.stats.items():
        step = _step(filename, function)
        if step == _OTHER and callers:
            # A builtin (len, a NamedTuple's __new__, bytes.join, ...): the step
            # of whoever called it, shared by the time spent in it per caller.
            spent = sum(row[2] for row in callers.values()) or 1.0
            for (caller_file, _, caller), row in callers.items():
                share = _step(caller_file, caller)
                steps[share] = steps.get(share, 0.0) + tottime * row[2] / spent
            continue
        steps[step] = steps.get(step, 0.0) + tottime
    total = sum(steps.values())
    print(f"== {path}: {cpu:.2f} µs of CPU per message here, {server:.2f} µs in {_server(url)}")
    for step, seconds in sorted(steps.items(), key=lambda item: -item[1]):
        print(f"  {step:<42} {seconds / total * cpu:6.2f} µs  ({seconds / total:4.0%})")


def _server(url: str) -> str:
    return "the masters" if Env(redis_url=url).cluster else "redis-server"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default="workers500,many100,many1000,many10000,pipelined")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, metavar="TOP", help="profile one round instead")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--steps", action="store_true", help="time each step, no server")
    parser.add_argument("--breakdown", action="store_true", help="CPU per message by step")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help=f"on a private {servers.CLUSTER_MASTERS}-master Redis Cluster (no replicas) "
        "instead of one redis-server",
    )
    args = parser.parse_args()
    if args.steps:
        for _ in range(args.rounds):
            found = asyncio.run(steps(args.messages))
            print("; ".join(f"{name} {us:.2f}" for name, us in found), flush=True)
        return
    redis_path = servers.find_binary("redis-server")
    if redis_path is None:
        sys.exit("redis-server not found")
    start_servers = servers.redis_cluster if args.cluster else servers.redis_server
    with start_servers(redis_path) as url:
        if args.cluster:
            print(f"cluster: {url} ({servers.CLUSTER_MASTERS} masters, no replicas)", flush=True)
        for path in args.paths.split(","):
            if args.breakdown:
                breakdown(url, path, args.messages)
                continue
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
                f"message: this process {client_cpu:5.2f} µs, {_server(url)} {server:5.2f} µs; "
                "rounds " + " ".join(f"{rate:,.0f}" for rate in rates),
                flush=True,
            )


if __name__ == "__main__":
    main()
