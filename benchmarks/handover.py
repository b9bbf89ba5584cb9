"""Late messages on an ordered subscription, with the ownership events around them.

Usage (from the repository root)::

    .venv/bin/python benchmarks/handover.py [--rate 1000] [--seconds 8] [--subscribers 4]
        [--rounds 3] [--late-ms 50]

The set-up of benchmarks/latency.py's ``streamsub-ordered`` row: a 16-partition
topic, an ordered subscription, 200 ordering keys, the subscribers in one
process (started one after the other, as the latency benchmark starts them),
and a publisher in another process publishing at a steady rate (one
``publish()`` per message) from the moment every subscriber has started. The
consumer records, per message, when it was sent and handled, its partition and
which subscriber handled it; every 5 ms it records which partitions each
subscriber owns (``statistics().owned``), and it keeps streamsub's log (the
hand-over lines). It then prints the messages later than ``--late-ms`` with the
ownership changes around them, and where in the round they fell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_SRC = BENCH_DIR.parent / "src"
for entry in (str(BENCH_DIR), str(REPO_SRC)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import servers  # noqa: E402
from impls.base import HEADER, Env, PacedPublish  # noqa: E402
from impls.streamsub_impl import StreamsubOrdered  # noqa: E402

TOPIC = "bench"
SUBSCRIPTION = "bench-sub"

_SPAWN = multiprocessing.get_context("spawn")


@dataclasses.dataclass(slots=True)
class Seen:
    seq: int
    sent_ns: int
    handled_ns: int
    partition: int
    subscriber: int
    attempt: int


def _publish(url: str, rate: int, seconds: float, done: Any) -> None:
    impl = StreamsubOrdered(Env(redis_url=url))
    try:
        asyncio.run(PacedPublish(rate=rate, seconds=seconds, size=100)(impl))
    finally:
        done.set()


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.time_ns(), record.getMessage()))


async def one_round(url: str, args: argparse.Namespace) -> None:
    import redis

    import streamsub

    admin = redis.Redis.from_url(url)
    admin.flushall()
    admin.close()
    async with streamsub.connect(url) as client:
        await client.create_topic(TOPIC, partitions=16)
        await client.create_subscription(
            SUBSCRIPTION, topic=TOPIC, start="earliest", enable_message_ordering=True
        )
    events = Events()
    logging.getLogger("streamsub").addHandler(events)
    logging.getLogger("streamsub").setLevel(logging.INFO)
    seen: list[Seen] = []
    owned_log: list[tuple[int, int, dict[int, int]]] = []

    def handler_for(index: int) -> Any:
        async def handler(message: streamsub.Message) -> None:
            now = time.time_ns()
            sent, seq = HEADER.unpack_from(message.data)
            seen.append(Seen(seq, sent, now, message._partition, index, message.delivery_attempt))

        return handler

    clients = [streamsub.connect(url) for _ in range(args.subscribers)]
    subscribers = [c.subscribe(SUBSCRIPTION, handler_for(i)) for i, c in enumerate(clients)]
    origin = time.time_ns()
    stop = asyncio.Event()

    async def watch() -> None:
        last: list[dict[int, int] | None] = [None] * len(subscribers)
        while not stop.is_set():
            for i, sub in enumerate(subscribers):
                with contextlib.suppress(Exception):
                    owned = dict(sub.statistics().owned)
                    if owned != last[i]:
                        owned_log.append((time.time_ns(), i, owned))
                        last[i] = owned
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        for sub in subscribers:
            await sub.__aenter__()
        started_ns = time.time_ns()
        done = _SPAWN.Event()
        proc = _SPAWN.Process(target=_publish, args=(url, args.rate, args.seconds, done))
        proc.start()
        n = round(args.rate * args.seconds)
        while len({s.seq for s in seen}) < n:
            await asyncio.sleep(0.05)
            if not proc.is_alive() and done.is_set() and len(seen) < n:
                await asyncio.sleep(5)
                break
        proc.join(10)
    finally:
        stop.set()
        await watcher
        for sub in subscribers:
            await sub.__aexit__(None, None, None)
        for c in clients:
            await c.aclose()
        logging.getLogger("streamsub").removeHandler(events)

    def ms(t: int) -> str:
        return f"{(t - origin) / 1e6:9.1f}"

    first_sent = min(s.sent_ns for s in seen)
    lat = sorted((s.handled_ns - s.sent_ns) / 1e6 for s in seen)
    print(
        f"subscribers started by {ms(started_ns)} ms, first message sent at {ms(first_sent)} ms;"
        f" {len(seen)} handled, p50 {statistics.median(lat):.2f} ms, "
        f"p99 {lat[int(len(lat) * 0.99)]:.2f} ms, max {lat[-1]:.1f} ms"
    )
    late = [s for s in seen if (s.handled_ns - s.sent_ns) / 1e6 > args.late_ms]
    by_part: dict[int, list[Seen]] = {}
    for s in late:
        by_part.setdefault(s.partition, []).append(s)
    print(f"  {len(late)} messages later than {args.late_ms} ms:")
    for part, items in sorted(by_part.items()):
        lats = [(s.handled_ns - s.sent_ns) / 1e6 for s in items]
        handled = [s.handled_ns for s in items]
        print(
            f"    partition {part:2}: {len(items)} msgs, sent {ms(min(s.sent_ns for s in items))}"
            f"..{ms(max(s.sent_ns for s in items))} ms, handled {ms(min(handled))}"
            f"..{ms(max(handled))} ms, latency {min(lats):.0f}..{max(lats):.0f}"
            f" ms, by subscriber(s) {sorted({s.subscriber for s in items})}, attempts "
            f"{sorted({s.attempt for s in items})}"
        )
    print("  ownership (statistics().owned) changes:")
    for t, i, owned in owned_log:
        print(f"    {ms(t)} ms  subscriber {i}: {sorted(owned)}")
    print("  streamsub log:")
    for t, line in events.lines:
        print(f"    {ms(t)} ms  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--late-ms", type=float, default=50.0)
    args = parser.parse_args()
    redis_path = servers.find_binary("redis-server")
    assert redis_path is not None
    with servers.redis_server(redis_path) as url:
        for r in range(args.rounds):
            print(f"round {r + 1}")
            asyncio.run(one_round(url, args))


if __name__ == "__main__":
    main()
