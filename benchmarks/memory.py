"""Subscriber memory under a backlog: does a subscriber's RSS stay flat as the backlog grows?

Usage (from the repository root)::

    .venv/bin/python benchmarks/memory.py [--backlogs 10000,100000,1000000] [--rounds 3]
        [--only streamsub,streamsub-ordered,handwritten,faststream] [--cap faststream=100000]
        [--json out.json] [--tracemalloc]

For each backlog size the backlog (100 B messages) is published first, once, as
fast as each implementation publishes (streamsub: ``publish_many`` of 1,000,
four in flight, into a 16-partition topic, under 200 ordering keys; the
hand-written loop and FastStream: pipelines of 1,000 ``XADD`` into one stream).
Then each round, for each implementation, a freshly spawned subscriber process
consumes the whole backlog through a consumer group of its own created at the
first message, with default flow control and a trivial ``async def`` handler
(it counts). The parent samples the child's RSS (``VmRSS`` in
``/proc/<pid>/status``) every 100 ms with the count handled so far; the child
reports its ``VmHWM`` (the kernel's exact peak) when it has handled everything.
Rounds interleave the implementations and rotate who goes first; the tables
show medians over rounds. See benchmarks/README.md.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_SRC = BENCH_DIR.parent / "src"
# Benchmark the working tree's streamsub; spawned children inherit sys.path.
for entry in (str(BENCH_DIR), str(REPO_SRC)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import redis  # noqa: E402

import servers  # noqa: E402

BACKLOGS = (10_000, 100_000, 1_000_000)
IMPLS = ("streamsub", "streamsub-ordered", "handwritten", "faststream")
SIZE = 100
PARTITIONS = 16
KEYS = 200
CHUNK = 1_000
CHUNKS_IN_FLIGHT = 4
READ_COUNT = 500
EARLY = 10_000
"""The "early" RSS is the first sample once this many messages were handled."""
SAMPLE_INTERVAL = 0.1
FLAT_WITHIN = 0.20
"""Issue 11: subscriber memory flat (within 20 %) from 10,000 to 1,000,000 messages."""

_SPAWN = multiprocessing.get_context("spawn")


def body(seq: int) -> bytes:
    head = seq.to_bytes(8, "big")
    return head + b"x" * (SIZE - len(head))


# -- publishing the backlog (in this process, untimed) -----------------------------------


def topic_name(n: int) -> str:
    return f"mem-{n}"


def stream_name(impl: str, n: int) -> str:
    return f"mem-{impl}-{n}"


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


async def publish_handwritten(url: str, n: int) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        for base in range(0, n, CHUNK):
            pipe = client.pipeline(transaction=False)
            for seq in range(base, min(base + CHUNK, n)):
                pipe.xadd(stream_name("handwritten", n), {b"d": body(seq)})
            await pipe.execute()
    finally:
        await client.aclose()


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


PUBLISHERS: dict[str, Callable[[str, int], Any]] = {
    "streamsub": publish_streamsub,
    "handwritten": publish_handwritten,
    "faststream": publish_faststream,
}


def source_of(impl: str) -> str:
    """Which published backlog an implementation consumes."""
    return "streamsub" if impl.startswith("streamsub") else impl


async def create_group(url: str, impl: str, n: int, group: str) -> None:
    """A consumer group (a subscription) at the backlog's first message."""
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
    from redis.asyncio import Redis

    stream = stream_name("handwritten", job.n)
    client = Redis.from_url(job.url)
    tally = Tally(job, handled, tracer)

    async def handler(data: bytes) -> None:
        tally.one()

    try:
        while tally.count < job.n:
            reply = await client.xreadgroup(
                job.group, "consumer-1", {stream: ">"}, count=READ_COUNT, block=1000
            )
            for _stream, entries in reply or ():
                ids = []
                for entry_id, fields in entries:
                    await handler(fields[b"d"])
                    ids.append(entry_id)
                await client.xack(stream, job.group, *ids)
    finally:
        await client.aclose()


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


IMPORTS = {
    "streamsub": ("streamsub",),
    "streamsub-ordered": ("streamsub",),
    "handwritten": ("redis.asyncio",),
    "faststream": ("faststream.redis",),
}
"""What each subscriber imports: its base RSS is taken after these, before connecting."""

CONSUMERS = {
    "streamsub": consume_streamsub,
    "streamsub-ordered": consume_streamsub,
    "handwritten": consume_handwritten,
    "faststream": consume_faststream,
}


def _subscriber_main(job: Job, handled: Any, results: Any) -> None:
    try:
        for module in IMPORTS[job.impl]:
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
                        msg = f"{job.impl}: subscriber exited with {proc.exitcode}, no result"
                        raise RuntimeError(msg) from None
                if time.monotonic() > deadline:
                    msg = f"{job.impl}: timed out after {handled.value:,} of {job.n:,}"
                    raise RuntimeError(msg) from None
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    if reply[0] != "ok":
        msg = f"{job.impl} subscriber failed:\n{reply[1]}"
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
        "it consumes ~3,000 msg/s here, a million would take minutes a round)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one round may take")
    parser.add_argument("--json", type=Path, help="write every raw figure to this file")
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


def markdown(results: Results, impls: list[str]) -> str:
    backlogs = list(results)
    head = " | ".join(f"{n:,}: peak / early" for n in backlogs)
    out = [
        f"| implementation | {head} | peak {backlogs[-1]:,} vs {backlogs[0]:,} |",
        "|---|" + "---:|" * (len(backlogs) + 1),
    ]
    for impl in impls:
        cells = []
        for n in backlogs:
            rounds = results[n].get(impl, [])
            cells.append(
                f"{mib(median(rounds, 'peak_kib'))} / {mib(median(rounds, 'early_kib'))}"
                if rounds
                else "—"
            )
        measured = [n for n in backlogs if results[n].get(impl)]
        ratio = "—"
        if len(measured) > 1:
            low = median(results[measured[0]][impl], "peak_kib")
            high = median(results[measured[-1]][impl], "peak_kib")
            ratio = f"{high / low:.2f}x" + (
                "" if measured[-1] == backlogs[-1] else f" (to {measured[-1]:,})"
            )
        out.append(f"| {impl} | {' | '.join(cells)} | {ratio} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    redis_path = servers.find_binary("redis-server")
    if redis_path is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    impls = list(args.only)
    results: Results = {n: {impl: [] for impl in impls} for n in args.backlogs}
    failed: list[str] = []
    load_at_start = os.getloadavg()
    with servers.redis_server(redis_path) as url:
        admin = redis.Redis.from_url(url)
        print(
            f"{servers.server_version(redis_path)}; backlogs {args.backlogs}; {args.rounds} "
            f"round(s); {os.cpu_count()} cpus, load {load_at_start[0]:.2f}"
            + ("; tracemalloc ON (RSS not comparable)" if args.tracemalloc else "")
        )
        for n in args.backlogs:
            for source in dict.fromkeys(source_of(impl) for impl in impls):
                if n > args.cap.get(source, n):
                    continue
                started = time.monotonic()
                asyncio.run(PUBLISHERS[source](url, n))
                print(f"published {n:,} for {source} in {time.monotonic() - started:.1f}s")
        for round_no in range(1, args.rounds + 1):
            shift = (round_no - 1) % len(impls)
            order = impls[shift:] + impls[:shift]
            for n in args.backlogs:
                for position, impl in enumerate(order, 1):
                    if n > args.cap.get(impl, n) or f"{impl}@{n}" in failed:
                        continue
                    group = f"g-{impl}-{n}-{round_no}"
                    asyncio.run(create_group(url, impl, n, group))
                    job = Job(impl=impl, url=url, n=n, group=group, trace=args.tracemalloc)
                    print(f"[round {round_no}] {n:>9,} {impl:<18}", end=" ", flush=True)
                    try:
                        got = one_round(job, round_no, position, args.timeout)
                    except Exception as exc:
                        failed.append(f"{impl}@{n}")
                        print(f"FAILED: {exc}")
                        continue
                    results[n][impl].append(got)
                    print(
                        f"peak {mib(got.peak_kib)} MiB (sampled {mib(got.sampled_peak_kib)}), "
                        f"early {mib(got.early_kib)}, base {mib(got.base_kib)}, "
                        f"end {mib(got.end_kib)} MiB; {got.elapsed_s:.1f}s "
                        f"({n / got.elapsed_s:,.0f} msg/s), load {os.getloadavg()[0]:.2f}"
                    )
                    if got.trace:
                        print(got.trace)
        info = admin.info("memory")
        print(f"redis used_memory at the end: {int(info['used_memory']) / 2**20:.0f} MiB")
        admin.close()
    print()
    print("RSS in MiB, medians over rounds: peak (VmHWM) / early (after the first 10,000 handled)")
    print(markdown(results, impls))
    for n, by_impl in results.items():
        for impl, rounds in by_impl.items():
            if rounds:
                each = " · ".join(mib(r.peak_kib) for r in rounds)
                print(f"  {impl} @ {n:,}: peaks {each} MiB")
    load_at_end = os.getloadavg()
    print(f"load (1 min) at start {load_at_start[0]:.2f}, at end {load_at_end[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": {
                "backlogs": args.backlogs,
                "rounds": args.rounds,
                "only": impls,
                "cap": args.cap,
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
            "results": {
                str(n): {
                    impl: [dataclasses.asdict(r) for r in rounds] for impl, rounds in by.items()
                }
                for n, by in results.items()
            },
            "failed": failed,
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        print(f"raw figures written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
