"""When is the publisher's writer "free"? Measures WRITER_FREE_BELOW and SPLIT_AT choices.

Usage (from the repository root)::

    .venv/bin/python benchmarks/writer_free.py 1 2 4 1
    .venv/bin/python benchmarks/writer_free.py --split-at 0 8 16 32

For each value given (a batch goes out at once while fewer writes than that are
in flight; see ``src/streamsub/_core/batch.py``), N concurrent callers each
awaiting ``publish()`` in a loop (N = 1, 10, 100, 500; median of 3 rounds), in
this process, against one private redis-server. The value is patched into the
engine's module before each client is made; nothing else changes.

``--split-at`` measures ``SPLIT_AT`` instead (from twice that many single
publishes outstanding, a batch is full at half of them: 0 never splits), for
N = 1, 10, 30, 100, 500 and 1,000, each round running every value in turn
(rotated), so that the values of one N are measured side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
for entry in (str(BENCH_DIR), str(BENCH_DIR.parent / "src")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import redis.asyncio as aioredis  # noqa: E402

import servers  # noqa: E402
import streamsub  # noqa: E402
from streamsub._engine import publisher  # noqa: E402

WORKERS = (1, 10, 100, 500)
SPLIT_WORKERS = (1, 10, 30, 100, 500, 1000)
BODY = b"x" * 100


async def workers(url: str, count: int, n: int) -> float:
    async with streamsub.connect(url) as client:
        await client.create_topic("bench", partitions=16)
        await client.publish("bench", BODY)
        sequence = iter(range(n))

        async def worker() -> None:
            for _ in sequence:
                await client.publish("bench", BODY)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(count)))
        return n / (time.perf_counter() - start)


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, aioredis.Redis]]:
    """A private redis-server: its URL and a client to empty it between rounds."""
    path = servers.find_binary("redis-server")
    if path is None:
        raise SystemExit("redis-server not found")
    with servers.redis_server(path) as url:
        admin = aioredis.Redis.from_url(url)
        try:
            yield url, admin
        finally:
            await admin.aclose()


def _messages(count: int) -> int:
    return 3000 if count == 1 else 20_000


async def main(values: list[int]) -> None:
    async with _server() as (url, admin):
        print("| free below | " + " | ".join(f"N={n}" for n in WORKERS) + " |")
        print("|---:|" + "---:|" * len(WORKERS))
        for value in values:
            publisher.WRITER_FREE_BELOW = value
            cells = []
            for count in WORKERS:
                rounds = []
                for _ in range(3):
                    await admin.flushall()
                    rounds.append(await workers(url, count, _messages(count)))
                cells.append(f"{statistics.median(rounds):,.0f}")
            print(f"| {value} | " + " | ".join(cells) + " |", flush=True)


async def split_at(values: list[int]) -> None:
    async with _server() as (url, admin):
        print("| N callers | " + " | ".join(f"SPLIT_AT={v}" for v in values) + " |")
        print("|---:|" + "---:|" * len(values))
        for count in SPLIT_WORKERS:
            by_value: dict[int, list[float]] = {value: [] for value in values}
            for r in range(3):
                for value in values[r % len(values) :] + values[: r % len(values)]:
                    publisher.SPLIT_AT = value
                    await admin.flushall()
                    by_value[value].append(await workers(url, count, _messages(count)))
            cells = [f"{statistics.median(by_value[value]):,.0f}" for value in values]
            print(f"| {count} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--split-at"]:
        asyncio.run(split_at([int(arg) for arg in sys.argv[2:]] or [0, 8, 16, 32]))
    else:
        asyncio.run(main([int(arg) for arg in sys.argv[1:]] or [1, 2, 4]))
