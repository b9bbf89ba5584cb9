"""N callers awaiting ``publish()``: streamsub beside the barest publisher asyncio allows.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bare_publish.py                  # 500 callers, 5 rounds
    .venv/bin/python benchmarks/bare_publish.py --callers 100 --rounds 7

Three rows, their rounds interleaved, against one private redis-server, in this
process, 20,000 messages of 100 B a round:

* ``pipelined`` -- the hand-written loop of ``run.py`` (``XADD`` pipelined 200
  at a time, one stream), the baseline of issue 11's 500-caller target;
* ``bare`` -- N callers each awaiting a ``publish()`` that does only what any
  awaited publish must: a future per call, the queued messages written as one
  ``EVALSHA`` (a five-line script that ``XADD``s each argument to one of 16
  streams in turn and returns the ids), at most two writes in flight, each of
  half the callers (as streamsub's crowd rule splits them), and each caller
  given its id. The command is packed by hiredis in C, the replies parsed by
  hiredis on a raw asyncio stream. No flow control, ordering keys, size check,
  partitioning, error handling, metrics or tracing;
* ``streamsub`` -- N callers each awaiting ``client.publish()`` on a topic of
  16 partitions, as ``run.py --scenarios workers``.

It prints msgs/s, each row's ratio to the pipelined loop, and this process's
CPU a message (``time.process_time``): what the client's Python costs, beside
the floor asyncio itself sets (the futures, the callers' task wake-ups).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for entry in (str(BENCH_DIR), str(BENCH_DIR.parent / "src")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import hiredis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402

import servers  # noqa: E402
import streamsub  # noqa: E402

BODY = b"x" * 100
STREAMS = 16
MESSAGES = 20_000
SCRIPT = (
    "local ids, n = {}, #KEYS "
    "for i = 1, #ARGV do "
    "ids[i] = redis.call('XADD', KEYS[(i - 1) % n + 1], '*', 'd', ARGV[i]) "
    "end "
    "return ids"
)


class BarePublisher:
    """A future per ``publish()``; the queue written as one script call while
    fewer than two writes are in flight, at most ``half`` messages a write."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sha: bytes, half: int
    ) -> None:
        self._reader, self._writer, self._half = reader, writer, half
        self._head = (b"EVALSHA", sha, STREAMS, *(f"s{i}".encode() for i in range(STREAMS)))
        self._futures: list[asyncio.Future[str]] = []
        self._data: list[bytes] = []
        self._in_flight: deque[list[asyncio.Future[str]]] = deque()
        self._loop = asyncio.get_running_loop()
        self._scheduled = False
        self._replies = asyncio.ensure_future(self._read())

    def publish(self, data: bytes) -> asyncio.Future[str]:
        future = self._loop.create_future()
        self._futures.append(future)
        self._data.append(data)
        if not self._scheduled and len(self._in_flight) < 2:
            self._scheduled = True
            self._loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        half = self._half
        while self._futures and len(self._in_flight) < 2:
            futures, data = self._futures[:half], self._data[:half]
            del self._futures[:half], self._data[:half]
            command: tuple[Any, ...] = (*self._head, *data)
            self._writer.write(hiredis.pack_command(command))
            self._in_flight.append(futures)

    async def _read(self) -> None:
        parser = hiredis.Reader()
        while data := await self._reader.read(1 << 16):
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                for future, entry_id in zip(self._in_flight.popleft(), reply, strict=True):
                    future.set_result(entry_id.decode())
            self._flush()

    async def aclose(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()
        self._replies.cancel()


async def callers(publish: Callable[[bytes], Awaitable[str]], count: int) -> tuple[float, float]:
    """msgs/s and this process's CPU µs a message, ``count`` callers in a loop."""
    sequence = iter(range(MESSAGES))

    async def caller() -> None:
        for _ in sequence:
            await publish(BODY)

    cpu, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(count)))
    elapsed = time.perf_counter() - start
    return MESSAGES / elapsed, (time.process_time() - cpu) / MESSAGES * 1e6


async def pipelined(url: str) -> tuple[float, float]:
    """The hand-written loop: ``XADD`` pipelined 200 at a time (impls/handwritten.py)."""
    client = aioredis.Redis.from_url(url)
    try:
        await client.ping()  # type: ignore[misc]
        cpu, start = time.process_time(), time.perf_counter()
        for base in range(0, MESSAGES, 200):
            pipe = client.pipeline(transaction=False)
            for _ in range(base, min(base + 200, MESSAGES)):
                pipe.xadd("loop", {"d": BODY})
            await pipe.execute()
        elapsed = time.perf_counter() - start
        return MESSAGES / elapsed, (time.process_time() - cpu) / MESSAGES * 1e6
    finally:
        await client.aclose()


async def bare(url: str, count: int) -> tuple[float, float]:
    admin = aioredis.Redis.from_url(url)
    try:
        sha = (await admin.script_load(SCRIPT)).encode()
    finally:
        await admin.aclose()
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    publisher = BarePublisher(reader, writer, sha, max(1, (count + 1) // 2))
    try:
        return await callers(publisher.publish, count)
    finally:
        await publisher.aclose()


async def with_streamsub(url: str, count: int) -> tuple[float, float]:
    async with streamsub.connect(url) as client:
        await client.create_topic("bench", partitions=STREAMS)
        await client.publish("bench", BODY)  # the topic looked up, the connection made
        return await callers(lambda data: client.publish("bench", data), count)


async def main(args: argparse.Namespace) -> None:
    path = servers.find_binary("redis-server")
    if path is None:
        raise SystemExit("redis-server not found")
    rows = ("pipelined", "bare", "streamsub")
    figures: dict[str, list[tuple[float, float]]] = {row: [] for row in rows}
    with servers.redis_server(path) as url:
        admin = aioredis.Redis.from_url(url)
        try:
            for r in range(args.rounds):
                for row in rows[r % 3 :] + rows[: r % 3]:  # rotated, round by round
                    await admin.flushall()
                    if row == "pipelined":
                        figures[row].append(await pipelined(url))
                    elif row == "bare":
                        figures[row].append(await bare(url, args.callers))
                    else:
                        figures[row].append(await with_streamsub(url, args.callers))
        finally:
            await admin.aclose()
    base = statistics.median(rate for rate, _ in figures["pipelined"])
    print(
        f"{args.callers} callers ('pipelined': one loop), {MESSAGES:,} messages of "
        f"{len(BODY)} B a round, medians of {args.rounds} rotated rounds"
    )
    print("| row | msgs/s | vs pipelined | client CPU µs a message | rounds (msgs/s) |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        rate = statistics.median(r for r, _ in figures[row])
        cpu = statistics.median(c for _, c in figures[row])
        rounds = " · ".join(f"{r:,.0f}" for r, _ in figures[row])
        print(f"| {row} | {rate:,.0f} | {rate / base:.2f}x | {cpu:.2f} | {rounds} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
