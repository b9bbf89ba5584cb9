"""Subscriber memory under a backlog: does a subscriber's RSS stay flat as the backlog grows?

Usage (from the repository root)::

    .venv/bin/python benchmarks/memory.py [--backlogs 10000,100000,1000000] [--rounds 3]
        [--only streamsub,streamsub-ordered,handwritten,faststream,nats]
        [--cap faststream=100000] [--cluster] [--json out.json] [--plot out.png]
        [--tracemalloc]

For each backlog size the backlog (100 B messages) is published first, once, as
fast as each implementation publishes (streamsub: ``publish_many`` of 1,000,
four in flight, into a 16-partition topic, under 200 ordering keys; the
hand-written loop and FastStream: pipelines of 1,000 ``XADD`` into one stream;
NATS: ``publish_async`` of 1,000, then their PubAcks, into a JetStream stream
of memory storage). Then each round, for each implementation, a freshly spawned
subscriber process consumes the whole backlog through a consumer group (NATS: a
durable pull consumer) of its own created at the first message, with default
flow control and a trivial ``async def`` handler (it counts). The parent
samples the child's RSS (``VmRSS`` in ``/proc/<pid>/status``) every 100 ms with
the count handled so far; the child reports its ``VmHWM`` (the kernel's exact
peak) when it has handled everything. Rounds interleave the implementations and
rotate who goes first; the tables show medians over rounds. See
benchmarks/README.md.

``--cluster`` also starts a private 3-master Redis Cluster (as run.py's) and
runs the rows that have a cluster form there too, as ``name@cluster``:
streamsub (unordered and ordered) given the cluster's URL, and the hand-written
loop over 16 streams spread evenly over the masters, one blocking reader per
stream (``HandwrittenCluster`` in impls/handwritten.py).

``--tracemalloc`` runs every subscriber under ``tracemalloc`` instead (slower:
the RSS figures of such a run do not compare with a normal run) and prints the
allocations that grew between the first 10,000 handled and the last message,
by source line: where the memory goes, if it grows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import platform
import queue
import statistics
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_SRC = BENCH_DIR.parent / "src"
# Benchmark the working tree's streamsub; spawned children inherit sys.path.
for entry in (str(BENCH_DIR), str(REPO_SRC)):
    if entry not in sys.path:
        sys.path.insert(0, entry)


import plotting  # noqa: E402
import servers  # noqa: E402

BACKLOGS = (10_000, 100_000, 1_000_000)
IMPLS = ("streamsub", "streamsub-ordered", "handwritten", "faststream", "nats")
CLUSTER = "@cluster"
"""The suffix of a row run on the private Redis Cluster (``--cluster``)."""
ON_CLUSTER = ("streamsub", "streamsub-ordered", "handwritten")
"""The implementations that have a cluster row (FastStream's broker and NATS do not)."""
CLUSTER_SCHEME = "redis+cluster://"
SIZE = 100
PARTITIONS = 16
KEYS = 200
CHUNK = 1_000
CHUNKS_IN_FLIGHT = 4
READ_COUNT = 500
FETCH_TIMEOUT_S = 1.0
"""NATS: how long one ``fetch`` waits for messages (as in impls/nats_impl.py)."""
EARLY = 10_000
"""The "early" RSS is the first sample once this many messages were handled."""
SAMPLE_INTERVAL = 0.1
FLAT_WITHIN = 0.20
"""Issue 11: subscriber memory flat (within 20 %) from 10,000 to 1,000,000 messages."""

_SPAWN = multiprocessing.get_context("spawn")


STARTED_AT = time.strftime("%Y-%m-%dT%H:%M:%S%z")
"""When this run began (the script was loaded), for its ``--json``."""


def body(seq: int) -> bytes:
    head = seq.to_bytes(8, "big")
    return head + b"x" * (SIZE - len(head))


# -- publishing the backlog (in this process, untimed) -----------------------------------


def topic_name(n: int) -> str:
    return f"mem-{n}"


def stream_name(impl: str, n: int) -> str:
    return f"mem-{impl}-{n}"


def nats_stream(n: int) -> str:
    """The JetStream stream of a backlog (its subject: :func:`nats_subject`)."""
    return f"MEM_{n}"


def nats_subject(n: int) -> str:
    return f"mem.{n}"


def impl_of(row: str) -> str:
    """The implementation a row runs: ``streamsub@cluster`` runs ``streamsub``."""
    return row.removesuffix(CLUSTER)


def is_cluster(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEME)


async def publish_streamsub(url: str, n: int) -> None:
    import streamsub

    window = asyncio.Semaphore(CHUNKS_IN_FLIGHT)
    async with streamsub.connect(url) as client:
        await client.create_topic(topic_name(n), partitions=PARTITIONS)

        async def chunk(base: int) -> None:
            async with window:
                await client.publish_many(
                    topic_name(n),
                    [
                        streamsub.OutgoingMessage(data=body(seq), ordering_key=f"key-{seq % KEYS}")
                        for seq in range(base, min(base + CHUNK, n))
                    ],
                )

        await asyncio.gather(*(chunk(base) for base in range(0, n, CHUNK)))


HandwrittenRead = Callable[[Any, str, str], Awaitable[Any]]
"""``read(client, group, stream)``: one blocking ``XREADGROUP COUNT 500`` of ``stream``."""


@contextlib.asynccontextmanager
async def handwritten_streams(
    url: str, n: int
) -> AsyncIterator[tuple[Any, list[str], HandwrittenRead]]:
    """A client, the streams of the hand-written loop's backlog (message ``seq`` in
    ``streams[seq % len(streams)]``) and how to read one: on one server one stream;
    on a cluster 16, spread evenly over the masters and each read on its master,
    as ``HandwrittenCluster`` in impls/handwritten.py does (imported only then:
    the one-server row's subscriber imports nothing but redis-py)."""
    if is_cluster(url):
        from redis.asyncio.cluster import RedisCluster

        from impls.base import cluster_nodes
        from impls.handwritten import CLUSTER_STREAMS, read_group, spread_streams

        cluster = RedisCluster(startup_nodes=cluster_nodes(url))
        try:
            await cluster.initialize()
            streams = spread_streams(cluster, CLUSTER_STREAMS, stream_name("handwritten", n))

            async def read_on_master(client: Any, group: str, stream: str) -> Any:
                return await read_group(client, group, "consumer-1", stream)

            yield cluster, streams, read_on_master
        finally:
            await cluster.aclose()
        return
    from redis.asyncio import Redis

    client = Redis.from_url(url)

    async def read(client: Any, group: str, stream: str) -> Any:
        return await client.xreadgroup(
            group, "consumer-1", {stream: ">"}, count=READ_COUNT, block=1000
        )

    try:
        yield client, [stream_name("handwritten", n)], read
    finally:
        await client.aclose()


async def publish_handwritten(url: str, n: int) -> None:
    async with handwritten_streams(url, n) as (client, streams, _read):
        for base in range(0, n, CHUNK):
            pipe = client.pipeline(transaction=False)
            for seq in range(base, min(base + CHUNK, n)):
                pipe.xadd(streams[seq % len(streams)], {b"d": body(seq)})
            await pipe.execute()


async def publish_faststream(url: str, n: int) -> None:
    from faststream.redis import RedisBroker

    broker = RedisBroker(url, logger=None)  # type: ignore[arg-type]
    async with broker:
        client = await broker.connect()
        for base in range(0, n, CHUNK):
            async with client.pipeline(transaction=False) as pipe:
                for seq in range(base, min(base + CHUNK, n)):
                    await broker.publish(
                        body(seq), stream=stream_name("faststream", n), pipeline=pipe
                    )
                await pipe.execute()


async def publish_nats(url: str, n: int) -> None:
    """A JetStream stream of memory storage (as run.py's default, like a
    redis-server that saves nothing), ``publish_async`` of 1,000 messages at a
    time, then their PubAcks."""
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        await js.add_stream(
            name=nats_stream(n), subjects=[nats_subject(n)], storage=StorageType.MEMORY
        )
        for base in range(0, n, CHUNK):
            acks = [
                await js.publish_async(nats_subject(n), body(seq))
                for seq in range(base, min(base + CHUNK, n))
            ]
            await asyncio.gather(*acks)  # raises if the server refused any message
    finally:
        await nc.close()


PUBLISHERS: dict[str, Callable[[str, int], Any]] = {
    "streamsub": publish_streamsub,
    "handwritten": publish_handwritten,
    "faststream": publish_faststream,
    "nats": publish_nats,
}


def source_of(row: str) -> str:
    """Which published backlog a row consumes (``streamsub@cluster`` for both
    streamsub rows on the cluster)."""
    impl = impl_of(row)
    return ("streamsub" if impl.startswith("streamsub") else impl) + row.removeprefix(impl)


async def create_group(url: str, impl: str, n: int, group: str) -> None:
    """A consumer group (a subscription; NATS: a durable pull consumer) at the
    backlog's first message."""
    if impl == "nats":
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc = await nats.connect(url, allow_reconnect=False)
        try:
            config = ConsumerConfig(
                durable_name=group, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL
            )
            await nc.jetstream().add_consumer(nats_stream(n), config)
        finally:
            await nc.close()
        return
    if impl == "handwritten":
        async with handwritten_streams(url, n) as (client, streams, _read):
            for stream in streams:
                await client.xgroup_create(stream, group, id="0")
        return
    if impl.startswith("streamsub"):
        import streamsub

        async with streamsub.connect(url) as client:
            await client.create_subscription(
                group,
                topic=topic_name(n),
                start="earliest",
                enable_message_ordering=impl == "streamsub-ordered",
            )
        return
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        await client.xgroup_create(stream_name(impl, n), group, id="0")
    finally:
        await client.aclose()


# -- the subscriber process ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    row: str
    """``impl``, or ``impl@cluster`` on the cluster (``url`` is then the cluster's)."""
    impl: str
    url: str
    n: int
    group: str
    trace: bool


def rss_kib(pid: int | str, field: str = "VmRSS") -> int | None:
    """``field`` of /proc/<pid>/status in KiB, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class Tracer:
    """tracemalloc snapshots at the first EARLY messages handled and at the end."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.early: Any = None
        self.late: Any = None
        self.finished: float | None = None
        """When the last message was handled (the subscriber's shutdown comes after)."""
        if enabled:
            import tracemalloc

            tracemalloc.start(8)

    def at_early(self) -> None:
        if self.enabled and self.early is None:
            import tracemalloc

            self.early = tracemalloc.take_snapshot()

    def at_end(self) -> None:
        """The last message was handled (the subscriber still runs)."""
        self.finished = time.monotonic()
        if self.enabled:
            import tracemalloc

            self.late = tracemalloc.take_snapshot()

    def report(self) -> str | None:
        if not self.enabled or self.early is None or self.late is None:
            return None
        import tracemalloc

        late = self.late
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        stats = late.filter_traces(ignore).compare_to(self.early.filter_traces(ignore), "lineno")
        current, peak = tracemalloc.get_traced_memory()
        lines = [
            f"traced after the subscriber stopped {current / 2**20:.1f} MiB, traced peak "
            f"{peak / 2**20:.1f} MiB; grown from the first {EARLY:,} handled to the last:"
        ]
        lines += [str(stat) for stat in stats[:15]]
        grown = late.filter_traces(ignore).compare_to(self.early.filter_traces(ignore), "traceback")
        if grown and grown[0].size_diff > 2**20:
            lines.append("largest growth, traceback:")
            lines += ["    " + line for line in grown[0].traceback.format()]
        return "\n".join(lines)


class Tally:
    """Counts what a subscriber handled: shares the count with the parent,
    takes the tracer's early and late snapshots, and says when all are in."""

    def __init__(self, job: Job, handled: Any, tracer: Tracer) -> None:
        self.n = job.n
        self.handled = handled
        self.tracer = tracer
        self.count = 0
        self.done = asyncio.Event()

    def one(self) -> None:
        self.count += 1
        self.handled.value = self.count
        if self.count == EARLY:
            self.tracer.at_early()
        if self.count == self.n:
            self.tracer.at_end()
            self.done.set()


async def consume_streamsub(job: Job, handled: Any, tracer: Tracer) -> None:
    import streamsub

    tally = Tally(job, handled, tracer)

    async def handler(message: streamsub.Message) -> None:
        tally.one()

    async with (
        streamsub.connect(job.url) as client,
        client.subscribe(job.group, handler),
    ):
        await tally.done.wait()


async def consume_handwritten(job: Job, handled: Any, tracer: Tracer) -> None:
    """One reader per stream (one on one server, 16 on a cluster), each looping
    ``XREADGROUP COUNT 500 BLOCK 1000`` and one ``XACK`` per batch, until the
    count is complete."""
    tally = Tally(job, handled, tracer)

    async def handler(data: bytes) -> None:
        tally.one()

    async with handwritten_streams(job.url, job.n) as (client, streams, read):

        async def reader(stream: str) -> None:
            while tally.count < job.n:
                for _stream, entries in await read(client, job.group, stream) or ():
                    ids = []
                    for entry_id, fields in entries:
                        await handler(fields[b"d"])
                        ids.append(entry_id)
                    await client.xack(stream, job.group, *ids)

        readers = [asyncio.create_task(reader(stream)) for stream in streams]
        try:
            # A reader ends only once the count is complete, or with an error.
            done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
            done.pop().result()
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def consume_faststream(job: Job, handled: Any, tracer: Tracer) -> None:
    from faststream.redis import RedisBroker, StreamSub

    broker = RedisBroker(job.url, logger=None)  # type: ignore[arg-type]
    tally = Tally(job, handled, tracer)

    @broker.subscriber(
        stream=StreamSub(
            stream_name("faststream", job.n),
            group=job.group,
            consumer="consumer-1",
            max_records=READ_COUNT,
        )
    )
    async def handle(data: bytes) -> None:
        tally.one()

    await broker.start()  # the group exists (at 0): FastStream keeps it
    try:
        await tally.done.wait()
    finally:
        await asyncio.wait_for(broker.stop(), timeout=30)


async def consume_nats(job: Job, handled: Any, tracer: Tracer) -> None:
    """The e2e consumer's loop (impls/nats_impl.py): ``fetch(500)`` from the durable
    pull consumer, ``msg.ack()`` for each message, a final flush."""
    import nats

    tally = Tally(job, handled, tracer)

    async def handler(data: bytes) -> None:
        tally.one()

    nc = await nats.connect(job.url, allow_reconnect=False)
    try:
        sub = await nc.jetstream().pull_subscribe_bind(durable=job.group, stream=nats_stream(job.n))
        while tally.count < job.n:
            try:
                msgs = await sub.fetch(READ_COUNT, timeout=FETCH_TIMEOUT_S)
            except TimeoutError:  # nats-py raises asyncio's or its own subclass
                continue
            for msg in msgs:
                await handler(msg.data)
                await msg.ack()
        await nc.flush()
    finally:
        await nc.close()


IMPORTS = {
    "streamsub": ("streamsub",),
    "streamsub-ordered": ("streamsub",),
    "handwritten": ("redis.asyncio",),
    "faststream": ("faststream.redis",),
    "nats": ("nats",),
    "streamsub@cluster": ("streamsub",),
    "streamsub-ordered@cluster": ("streamsub",),
    "handwritten@cluster": ("redis.asyncio", "redis.asyncio.cluster", "impls.handwritten"),
}
"""What each subscriber imports: its base RSS is taken after these, before connecting."""

CONSUMERS = {
    "streamsub": consume_streamsub,
    "streamsub-ordered": consume_streamsub,
    "handwritten": consume_handwritten,
    "faststream": consume_faststream,
    "nats": consume_nats,
}


def _subscriber_main(job: Job, handled: Any, results: Any) -> None:
    try:
        for module in IMPORTS[job.row]:
            __import__(module)
        base = rss_kib("self")
        tracer = Tracer(job.trace)
        started = time.monotonic()
        asyncio.run(CONSUMERS[job.impl](job, handled, tracer))
        elapsed = (tracer.finished or time.monotonic()) - started
        results.put(
            ("ok", base, rss_kib("self", "VmHWM"), rss_kib("self"), elapsed, tracer.report())
        )
    except BaseException:
        results.put(("error", traceback.format_exc()))


# -- one round -----------------------------------------------------------------------------


@dataclasses.dataclass
class Round:
    round: int
    position: int
    peak_kib: int
    """The child's VmHWM when it had handled everything (the kernel's exact peak)."""
    sampled_peak_kib: int
    early_kib: int
    """RSS at the first sample with EARLY or more handled (or the last one, if fewer)."""
    base_kib: int
    """RSS with the library imported, before connecting (the interpreter's own share)."""
    end_kib: int
    elapsed_s: float
    """From the start of the subscriber process's run (after its imports) to the last
    message handled: it includes connecting, not the shutdown."""
    samples: int
    trace: str | None = None


def one_round(job: Job, round_no: int, position: int, timeout: float) -> Round:
    handled = _SPAWN.RawValue("q", 0)
    results = _SPAWN.Queue()
    proc = _SPAWN.Process(target=_subscriber_main, args=(job, handled, results))
    proc.start()
    samples: list[tuple[int, int]] = []  # (handled, rss KiB)
    deadline = time.monotonic() + timeout
    reply: Any = None
    try:
        while reply is None:
            rss = rss_kib(proc.pid)  # type: ignore[arg-type]
            if rss is not None:
                samples.append((handled.value, rss))
            try:
                reply = results.get(timeout=SAMPLE_INTERVAL)
            except queue.Empty:
                if not proc.is_alive():
                    with contextlib.suppress(queue.Empty):
                        reply = results.get(timeout=1.0)
                    if reply is None:
                        msg = f"{job.row}: subscriber exited with {proc.exitcode}, no result"
                        raise RuntimeError(msg) from None
                if time.monotonic() > deadline:
                    msg = f"{job.row}: timed out after {handled.value:,} of {job.n:,}"
                    raise RuntimeError(msg) from None
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    if reply[0] != "ok":
        msg = f"{job.row} subscriber failed:\n{reply[1]}"
        raise RuntimeError(msg)
    _, base, hwm, end, elapsed, trace = reply
    early = next((rss for count, rss in samples if count >= EARLY), samples[-1][1])
    return Round(
        round=round_no,
        position=position,
        peak_kib=hwm,
        sampled_peak_kib=max(rss for _, rss in samples),
        early_kib=early,
        base_kib=base,
        end_kib=end,
        elapsed_s=elapsed,
        samples=len(samples),
        trace=trace,
    )


# -- the run ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def names(text: str) -> list[str]:
        return [name.strip() for name in text.split(",") if name.strip()]

    def caps(text: str) -> dict[str, int]:
        return {k: int(v) for k, _, v in (item.partition("=") for item in names(text))}

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backlogs",
        type=lambda s: [int(x) for x in names(s)],
        default=list(BACKLOGS),
        help="backlog sizes in messages (default 10000,100000,1000000)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", type=names, default=list(IMPLS), help=",".join(IMPLS))
    parser.add_argument(
        "--cap",
        type=caps,
        default={"faststream": 100_000},
        help="largest backlog for a slow implementation (default faststream=100000: "
        "it consumes ~3,000 msg/s here, a million would take minutes a round); "
        "NAME caps its cluster row too, NAME@cluster that row alone",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also start a private 3-master Redis Cluster and run "
        f"{', '.join(ON_CLUSTER)} there too, as name{CLUSTER}",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one round may take")
    parser.add_argument("--json", type=Path, help="write every raw figure to this file")
    parser.add_argument(
        "--plot", type=Path, help="draw the peak RSS per backlog, one line per row, into this PNG"
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="trace allocations; print what grew"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in IMPLS]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; choose from {list(IMPLS)}")
    return args


Results = dict[int, dict[str, list[Round]]]


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def median(rounds: list[Round], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in rounds)


def cap_of(caps: dict[str, int], row: str) -> int | None:
    """The largest backlog ``row`` consumes: its own cap, else its implementation's."""
    return caps.get(row, caps.get(impl_of(row)))


def flatness(results: Results, row: str) -> tuple[float, int] | None:
    """The median peak at the largest backlog ``row`` ran over the one at the
    smallest, and that largest backlog; None with fewer than two backlogs."""
    measured = [n for n in results if results[n].get(row)]
    if len(measured) < 2:
        return None
    low = median(results[measured[0]][row], "peak_kib")
    high = median(results[measured[-1]][row], "peak_kib")
    return high / low, measured[-1]


def markdown(results: Results, rows: list[str]) -> str:
    backlogs = list(results)
    head = " | ".join(f"{n:,}: peak / early" for n in backlogs)
    out = [
        f"| implementation | {head} | peak {backlogs[-1]:,} vs {backlogs[0]:,} |",
        "|---|" + "---:|" * (len(backlogs) + 1),
    ]
    for row in rows:
        cells = []
        for n in backlogs:
            rounds = results[n].get(row, [])
            cells.append(
                f"{mib(median(rounds, 'peak_kib'))} / {mib(median(rounds, 'early_kib'))}"
                if rounds
                else "—"
            )
        flat = flatness(results, row)
        ratio = "—"
        if flat is not None:
            ratio = f"{flat[0]:.2f}x" + ("" if flat[1] == backlogs[-1] else f" (to {flat[1]:,})")
        out.append(f"| {row} | {' | '.join(cells)} | {ratio} |")
    return "\n".join(out)


def plot(results: Results, rows: list[str], path: Path) -> str | None:
    """The median peak RSS (VmHWM) against the backlog, one line per row (a
    cluster row dashed, in its implementation's colour), the y axis from 0 so
    that flat looks flat; the reason if not drawn."""
    plt = plotting.pyplot()
    if plt is None:
        return plotting.MISSING
    backlogs = list(results)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    impls = list(dict.fromkeys(impl_of(row) for row in rows))
    drawn = False
    for row in rows:
        points = [
            (n, median(results[n][row], "peak_kib") / 1024) for n in backlogs if results[n].get(row)
        ]
        if not points:
            continue
        flat = flatness(results, row)
        label = row + (f" ({flat[0]:.2f}x)" if flat else "")
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs,
            ys,
            marker="o",
            linestyle="--" if row.endswith(CLUSTER) else "-",
            color=palette[impls.index(impl_of(row)) % len(palette)],
            label=label,
        )
        drawn = True
    if not drawn:
        plt.close(fig)
        return "no round finished"
    ax.set_xscale("log")
    ax.set_xticks(backlogs, [f"{n:,}" for n in backlogs])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("backlog (messages waiting when the subscriber starts)")
    ax.set_ylabel("subscriber peak RSS, MiB (median of rounds)")
    ax.set_title("Subscriber memory under a backlog (ratio: largest backlog / smallest)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    plotting.save(plt, fig, path)
    return None


async def used_memory_mib(url: str) -> float:
    """``used_memory`` of the one server, or summed over the cluster's masters."""
    from impls.base import redis_nodes

    total = 0
    async with redis_nodes(url) as clients:
        for client in clients:
            total += int((await client.info("memory"))["used_memory"])
    return total / 2**20


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    redis_path = servers.find_binary("redis-server")
    if redis_path is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    impls = list(args.only)
    nats_path = servers.find_binary("nats-server") if "nats" in impls else None
    if "nats" in impls and nats_path is None:
        impls.remove("nats")
        print("NOTE: skipping nats: nats-server not found (looked on PATH and in /usr/sbin)")
    rows = impls + [impl + CLUSTER for impl in impls if args.cluster and impl in ON_CLUSTER]
    if not rows:
        print("no implementation left to run", file=sys.stderr)
        return 2
    results: Results = {n: {row: [] for row in rows} for n in args.backlogs}
    failed: list[str] = []
    load_at_start = os.getloadavg()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(servers.redis_server(redis_path))
        cluster_url = (
            stack.enter_context(servers.redis_cluster(redis_path)) if args.cluster else None
        )
        nats_url = stack.enter_context(servers.nats_server(nats_path)) if nats_path else None

        def url_of(row: str) -> str:
            if row.endswith(CLUSTER):
                assert cluster_url is not None
                return cluster_url
            if row == "nats":
                assert nats_url is not None
                return nats_url
            return url

        print(
            f"{servers.server_version(redis_path)}"
            + (f" (and a {servers.CLUSTER_MASTERS}-master cluster)" if cluster_url else "")
            + (f"; {servers.server_version(nats_path)}" if nats_path else "")
            + f"; backlogs {args.backlogs}; {args.rounds} round(s); {os.cpu_count()} cpus, "
            f"load {load_at_start[0]:.2f}"
            + ("; tracemalloc ON (RSS not comparable)" if args.tracemalloc else "")
        )
        for n in args.backlogs:
            for source in dict.fromkeys(source_of(row) for row in rows):
                wanted = [r for r in rows if source_of(r) == source]
                if all(n > (cap_of(args.cap, r) or n) for r in wanted):
                    continue
                started = time.monotonic()
                asyncio.run(PUBLISHERS[impl_of(source)](url_of(source), n))
                print(f"published {n:,} for {source} in {time.monotonic() - started:.1f}s")
        for round_no in range(1, args.rounds + 1):
            shift = (round_no - 1) % len(rows)
            order = rows[shift:] + rows[:shift]
            for n in args.backlogs:
                for position, row in enumerate(order, 1):
                    if n > (cap_of(args.cap, row) or n) or f"{row}@{n}" in failed:
                        continue
                    group = f"g-{impl_of(row)}-{n}-{round_no}"
                    asyncio.run(create_group(url_of(row), impl_of(row), n, group))
                    job = Job(
                        row=row,
                        impl=impl_of(row),
                        url=url_of(row),
                        n=n,
                        group=group,
                        trace=args.tracemalloc,
                    )
                    print(f"[round {round_no}] {n:>9,} {row:<26}", end=" ", flush=True)
                    try:
                        got = one_round(job, round_no, position, args.timeout)
                    except Exception as exc:
                        failed.append(f"{row}@{n}")
                        print(f"FAILED: {exc}")
                        continue
                    results[n][row].append(got)
                    print(
                        f"peak {mib(got.peak_kib)} MiB (sampled {mib(got.sampled_peak_kib)}), "
                        f"early {mib(got.early_kib)}, base {mib(got.base_kib)}, "
                        f"end {mib(got.end_kib)} MiB; {got.elapsed_s:.1f}s "
                        f"({n / got.elapsed_s:,.0f} msg/s), load {os.getloadavg()[0]:.2f}"
                    )
                    if got.trace:
                        print(got.trace)
        used = asyncio.run(used_memory_mib(url))
        print(f"redis used_memory at the end: {used:.0f} MiB")
        if cluster_url:
            used = asyncio.run(used_memory_mib(cluster_url))
            print(f"cluster used_memory at the end (all masters): {used:.0f} MiB")
    print()
    print("RSS in MiB, medians over rounds: peak (VmHWM) / early (after the first 10,000 handled)")
    print(markdown(results, rows))
    for n, by_row in results.items():
        for row, rounds in by_row.items():
            if rounds:
                each = " · ".join(mib(r.peak_kib) for r in rounds)
                print(f"  {row} @ {n:,}: peaks {each} MiB")
    load_at_end = os.getloadavg()
    print(f"load (1 min) at start {load_at_start[0]:.2f}, at end {load_at_end[0]:.2f}")
    if args.plot:
        not_drawn = plot(results, rows, args.plot)
        print(f"plot not drawn: {not_drawn}" if not_drawn else f"plot written to {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "started_at": STARTED_AT,
            "config": {
                "backlogs": args.backlogs,
                "rounds": args.rounds,
                "only": impls,
                "rows": rows,
                "cap": args.cap,
                "cluster": args.cluster,
                "tracemalloc": args.tracemalloc,
            },
            "machine": {
                "cpus": os.cpu_count(),
                "loadavg_at_start": load_at_start,
                "loadavg_at_end": load_at_end,
                "python": sys.version,
                "platform": platform.platform(),
            },
            "redis": servers.server_version(redis_path),
            "nats": servers.server_version(nats_path) if nats_path else None,
            "results": {
                str(n): {row: [dataclasses.asdict(r) for r in rounds] for row, rounds in by.items()}
                for n, by in results.items()
            },
            "failed": failed,
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        print(f"raw figures written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
