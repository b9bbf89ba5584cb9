"""Soak: publish and consume 1,000,000 messages under a retention policy; watch Redis memory.

Usage (from the repository root)::

    .venv/bin/python benchmarks/soak_retention.py                # 1,000,000, max_length 10,000
    .venv/bin/python benchmarks/soak_retention.py --no-retention # the same without a policy

A private redis-server (no persistence) is started; one topic with
``--partitions`` partitions and ``Retention(max_length=--max-length)``, one
subscription, one subscriber acking everything, one publisher publishing in
chunks of 1,000 as fast as the subscriber keeps up (it waits when the backlog
passes ``--max-backlog``). The client's background trimmer runs every
``--interval`` seconds. Redis ``used_memory`` and the streams' total length
are sampled every ``--sample`` seconds; the peak and final figures are printed
(and written as JSON with ``--json``). Memory stays bounded when the peak does
not grow with the message count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import redis

import streamsub
from streamsub.testing import redis_server

CHUNK = 1000


async def soak(args: argparse.Namespace, url: str) -> dict[str, object]:
    plain = redis.Redis.from_url(url)
    keys = [f"ss:{{soak.{p}}}" for p in range(args.partitions)]
    retention = None if args.no_retention else streamsub.Retention(max_length=args.max_length)
    samples: list[tuple[float, int, int]] = []
    handled = 0

    async def handle(message: streamsub.Message) -> None:
        nonlocal handled
        handled += 1

    async def sample(started: float) -> None:
        while True:
            used = int(plain.info("memory")["used_memory"])
            length = sum(int(plain.xlen(k)) for k in keys)
            samples.append((time.monotonic() - started, used, length))
            await asyncio.sleep(args.sample)

    async with streamsub.connect(url, retention_interval=args.interval) as client:
        await client.create_topic("soak", partitions=args.partitions, retention=retention)
        await client.create_subscription("soak-sub", topic="soak")
        baseline = int(plain.info("memory")["used_memory"])
        body = b"x" * args.size
        started = time.monotonic()
        sampler = asyncio.create_task(sample(started))
        published = 0
        async with client.subscribe(
            "soak-sub", handle, flow_control=streamsub.FlowControl(max_messages=5000)
        ) as subscriber:
            while published < args.messages:
                # Polling the handler's counter: an Event set per message costs more.
                while published - handled > args.max_backlog:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                count = min(CHUNK, args.messages - published)
                await client.publish_many("soak", [body] * count)
                published += count
            while handled < args.messages:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            lost = subscriber.statistics().lost
        elapsed = time.monotonic() - started
        # One last pass, as a trimmer would make within an interval.
        await client.enforce_retention("soak")
        await asyncio.sleep(args.sample)
        sampler.cancel()
        final_used = int(plain.info("memory")["used_memory"])
        final_length = sum(int(plain.xlen(k)) for k in keys)
        stats = await client.stats("soak")
    plain.close()
    peak_used = max(s[1] for s in samples)
    peak_length = max(s[2] for s in samples)
    return {
        "messages": args.messages,
        "partitions": args.partitions,
        "size": args.size,
        "retention_max_length": None if retention is None else args.max_length,
        "seconds": round(elapsed, 1),
        "msgs_per_s": round(args.messages / elapsed),
        "baseline_used_memory": baseline,
        "peak_used_memory": peak_used,
        "final_used_memory": final_used,
        "peak_stream_entries": peak_length,
        "final_stream_entries": final_length,
        "final_stream_memory": stats.topics[0].memory_bytes,
        "dropped_unacked": stats.topics[0].dropped_unacked,
        "handled": handled,
        "lost": lost,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=10_000, help="entries per partition")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--interval", type=float, default=1.0, help="trimmer interval, s")
    parser.add_argument("--sample", type=float, default=1.0, help="memory sample interval, s")
    parser.add_argument("--max-backlog", type=int, default=20_000)
    parser.add_argument("--no-retention", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with redis_server(extra_args=("--appendonly", "no")) as server:
        result = asyncio.run(soak(args, server.url))
    mib = 2**20
    print(
        f"{result['messages']:,} messages of {result['size']} B over {result['partitions']} "
        f"partitions, retention max_length={result['retention_max_length']}: "
        f"{result['seconds']} s ({result['msgs_per_s']:,}/s)"
    )
    for name in ("baseline_used_memory", "peak_used_memory", "final_used_memory"):
        print(f"  {name}: {int(result[name]) / mib:.1f} MiB")  # type: ignore[call-overload]
    print(
        f"  stream entries: peak {result['peak_stream_entries']:,}, "
        f"final {result['final_stream_entries']:,}; final stream memory "
        f"{int(result['final_stream_memory'] or 0) / mib:.1f} MiB; "  # type: ignore[call-overload]
        f"dropped unacked {result['dropped_unacked']}; handled {result['handled']:,} "
        f"(lost: {result['lost']})"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
