"""Redis's own CPU a message appended: streamsub's append script against plain commands.

``publish_many`` of 100 is the publish target that misses by the most on one
server, and its calls are serial: the client's Python, then Redis's work on
the write, then the client again. This measures the Redis half on its own. It
starts a private redis-server, writes batches of 100-byte messages to one
stream in each of these ways, rounds interleaved, and reads redis-server's
CPU (``INFO cpu``, user and system) before and after each round:

* ``append``: streamsub's ``append.lua`` with a run of data alone (packed by
  ``codec.pack_data``), unlinked, sent as the publisher sends it: ``EVAL``
  with the script's source (comment lines left out);
* ``append-linked``: the same, each write linked to the one before it (its
  link read, compared and set), as a write behind another in flight is;
* ``append-evalsha``: ``append`` by ``EVALSHA``: what sending and hashing
  the source costs (the publisher sends ``EVAL``: a ``NOSCRIPT`` retry
  would let a later write overtake an earlier one);
* ``lua-xadd``: a script that only calls ``XADD`` once a message, with the
  same data each time: the floor under any script that appends a message per
  ``redis.call``;
* ``lua-call``: a script that only calls ``EXISTS`` once a message and
  stores its answer (it writes nothing): a ``redis.call``, the Lua around it
  and a share of the ``EVALSHA``;
* ``pipelined``: ``XADD`` pipelined, a batch a pipeline, one stream (as the
  hand-written loop writes on one server, which sends 200 a pipeline);
* ``multi``: ``MULTI``, ``XADD NOMKSTREAM`` a message, ``EXEC``, one
  pipeline a batch: plain commands that run together or not at all (no
  rollback: a missing stream makes each ``XADD NOMKSTREAM`` answer nil).

Last, with no server, it times the client's Python a message for a write
sent the first way (``pack_data``, the ids split from one reply) and the
last (``MULTI``'s commands written as RESP by hand, its replies read with
hiredis): what the client would pay for what Redis would save.

Each round checks that the stream holds every message it wrote, and prints
its wall time too: the CPU window also holds what redis-server does while
idle (its cron), more for the slower ways.

Usage (from the repository root)::

    .venv/bin/python benchmarks/append_cost.py --rounds 9
    .venv/bin/python benchmarks/append_cost.py --rounds 9 --server /path/to/redis-server

CPU per message is far steadier than msgs/s on a shared machine, but it is
still time: quote the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import hiredis
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers
from streamsub._backends.redis._backend import _script, _without_comments
from streamsub._core.codec import pack_data

STREAM = "append-cost"
LINK = "append-cost-link"

LUA_XADD = """
local d = string.rep('x', tonumber(ARGV[2]))
local ids = {}
for i = 1, tonumber(ARGV[1]) do ids[i] = redis.call('XADD', KEYS[1], '*', 'd', d) end
return table.concat(ids, ' ')
"""

LUA_CALL = """
local ids = {}
for i = 1, tonumber(ARGV[1]) do ids[i] = redis.call('EXISTS', KEYS[1]) end
return #ids
"""

WRITES_NOTHING = {"lua-call"}


async def measure(
    url: str, batch: int, batches: int, size: int, rounds: int
) -> dict[str, list[float]]:
    client = Redis.from_url(url)
    datas = [bytes([65 + i % 26]) * size for i in range(batch)]
    blob = pack_data(datas, [size] * batch)
    source = _without_comments(_script("append.lua"))
    sha = {
        "append": await client.script_load(source),
        "lua-xadd": await client.script_load(LUA_XADD),
        "lua-call": await client.script_load(LUA_CALL),
    }
    written = 0

    async def append_write() -> object:
        return await client.eval(source, 1, STREAM, blob)  # type: ignore[misc]

    async def append_linked() -> object:
        nonlocal written
        written += 1
        behind = written - 1 if written > 1 else ""
        return await client.eval(source, 2, STREAM, LINK, blob, written, behind)  # type: ignore[misc]

    async def append_evalsha() -> object:
        return await client.evalsha(sha["append"], 1, STREAM, blob)  # type: ignore[misc]

    async def lua_xadd() -> object:
        return await client.evalsha(sha["lua-xadd"], 1, STREAM, batch, size)  # type: ignore[misc]

    async def lua_call() -> object:
        return await client.evalsha(sha["lua-call"], 1, STREAM, batch)  # type: ignore[misc]

    async def pipelined() -> object:
        pipe = client.pipeline(transaction=False)
        for data in datas:
            pipe.xadd(STREAM, {"d": data})
        return await pipe.execute()

    async def multi() -> object:
        pipe = client.pipeline(transaction=True)
        for data in datas:
            pipe.xadd(STREAM, {"d": data}, nomkstream=True)
        return await pipe.execute()

    write: dict[str, Callable[[], Awaitable[object]]] = {
        "append": append_write,
        "append-linked": append_linked,
        "append-evalsha": append_evalsha,
        "lua-xadd": lua_xadd,
        "lua-call": lua_call,
        "pipelined": pipelined,
        "multi": multi,
    }
    cpu: dict[str, list[float]] = {way: [] for way in write}
    try:
        for round_no in range(rounds):
            order = list(write) if round_no % 2 == 0 else list(reversed(write))
            for way in order:
                await client.delete(STREAM, LINK)
                await client.xadd(STREAM, {"d": b"first"})
                written = 0
                before = await servers.cpu_seconds(client)
                started = time.perf_counter()
                for _ in range(batches):
                    await write[way]()
                wall = time.perf_counter() - started
                after = await servers.cpu_seconds(client)
                stored = await client.xlen(STREAM)
                expected = 1 + (0 if way in WRITES_NOTHING else batch * batches)
                if stored != expected:
                    msg = f"{way}: the stream holds {stored} entries, expected {expected}"
                    raise RuntimeError(msg)
                cpu[way].append((after - before) * 1e6 / (batch * batches))
                print(
                    f"round {round_no + 1} {way:<14} {cpu[way][-1]:.3f} µs a message "
                    f"(round {wall:.2f} s)",
                    flush=True,
                )
    finally:
        await client.aclose()
    return cpu


def client_costs(batch: int, size: int, repeat: int = 2000, rounds: int = 7) -> dict[str, float]:
    """Microseconds of the client's Python a message, with no server, for the two
    ways a write could go: streamsub's (``pack_data``, the reply's ids split
    from one string) and ``MULTI``/``EXEC`` (each ``XADD NOMKSTREAM`` written as
    RESP by hand, the ``MULTI``'s, ``QUEUED``s' and ``EXEC``'s replies read
    with hiredis, as a client without redis-py's pipeline would)."""
    datas = [bytes([65 + i % 26]) * size for i in range(batch)]
    sizes = [size] * batch
    key = b"ss:{bench.3}"
    head = b"*6\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$10\r\nNOMKSTREAM\r\n$1\r\n*\r\n$1\r\nd\r\n" % (
        len(key),
        key,
    )
    ids = [b"1765152000000-%d" % i for i in range(batch)]
    script_reply = b" ".join(ids)
    multi_reply = b"".join(
        (
            b"+OK\r\n",
            b"+QUEUED\r\n" * batch,
            b"*%d\r\n" % batch,
            *(b"$%d\r\n%s\r\n" % (len(i), i) for i in ids),
        )
    )

    def write_multi() -> bytes:
        parts = [b"*1\r\n$5\r\nMULTI\r\n"]
        for data in datas:
            parts += (head, b"$%d\r\n" % len(data), data, b"\r\n")
        parts.append(b"*1\r\n$4\r\nEXEC\r\n")
        return b"".join(parts)

    def read_multi() -> list[str]:
        reader = hiredis.Reader()
        reader.feed(multi_reply)
        for _ in range(batch + 1):  # +OK, then a +QUEUED a message
            reader.gets()
        return [entry_id.decode() for entry_id in reader.gets()]

    steps: dict[str, Callable[[], object]] = {
        "streamsub: pack_data": lambda: pack_data(datas, sizes),
        "streamsub: split the ids": lambda: script_reply.decode().split(),
        "MULTI: write the commands": write_multi,
        "MULTI: read the replies": read_multi,
    }
    costs = {}
    for name, step in steps.items():
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(repeat):
                step()
            times.append((time.perf_counter() - started) * 1e6 / (repeat * batch))
        costs[name] = statistics.median(times)
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="redis-server (or valkey-server) to run; default: PATH's")
    parser.add_argument("--batch", type=int, default=100, help="messages a write")
    parser.add_argument("--batches", type=int, default=2000, help="writes a round")
    parser.add_argument("--size", type=int, default=100, help="bytes a message")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    path = args.server or servers.find_binary("redis-server")
    if path is None:
        print("redis-server not found: give --server", file=sys.stderr)
        return 2
    print(servers.server_version(path))
    print(
        f"{args.rounds} rounds of {args.batches:,} writes of {args.batch} messages of {args.size} B"
    )
    with servers.redis_server(path) as url:
        cpu = asyncio.run(measure(url, args.batch, args.batches, args.size, args.rounds))
    print(
        f"\nredis-server CPU a message (µs), medians of {args.rounds} rounds of "
        f"{args.batches:,} writes of {args.batch}:"
    )
    floor = statistics.median(cpu["pipelined"])
    for way, values in cpu.items():
        median = statistics.median(values)
        spread = ", ".join(f"{value:.2f}" for value in values)
        print(f"  {way:<14} {median:.2f}  ({median / floor:.2f}x pipelined; rounds {spread})")
    print("\nthe client's Python a message (µs), no server, medians of 7 rounds:")
    for name, cost in client_costs(args.batch, args.size).items():
        print(f"  {name:<26} {cost:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
