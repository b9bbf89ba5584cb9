"""Redis's own CPU a message appended: streamsub's append script against plain commands.

``publish_many`` of 100 is the publish target that misses by the most on one
server, and its calls are serial: the client's Python, then Redis's work on
the write, then the client again. This measures the Redis half on its own. It
starts a private redis-server, writes batches of 100-byte messages to one
stream in each of these ways, rounds interleaved, and reads redis-server's
CPU (``INFO cpu``, user and system) before and after each round:

* ``append``: streamsub's ``append.lua`` with a run of data alone (packed by
  ``codec.pack_data``), unlinked, as a ``publish_many`` of bytes is written;
* ``append-linked``: the same as the write behind another in flight (its link
  read and set);
* ``lua-xadd``: a script that only calls ``XADD`` once a message, with the
  same data each time: the floor under any script that appends a message per
  ``redis.call``;
* ``lua-call``: a script that only calls ``EXISTS`` once a message: what a
  ``redis.call`` costs by itself;
* ``pipelined``: ``XADD`` pipelined, a batch a pipeline (the hand-written loop);
* ``multi``: ``MULTI``, ``XADD NOMKSTREAM`` a message, ``EXEC``, one
  pipeline a batch: plain commands that still go all or nothing.

Usage (from the repository root)::

    .venv/bin/python benchmarks/append_cost.py
    .venv/bin/python benchmarks/append_cost.py --server /path/to/valkey-server

CPU per message is far steadier than msgs/s on a shared machine, but it is
still time: quote the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Awaitable, Callable
from importlib.resources import files
from pathlib import Path

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers
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

WAYS = ("append", "append-linked", "lua-xadd", "lua-call", "pipelined", "multi")


async def _server_cpu(client: Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def measure(
    url: str, batch: int, batches: int, size: int, rounds: int
) -> dict[str, list[float]]:
    client = Redis.from_url(url)
    datas = [bytes([65 + i % 26]) * size for i in range(batch)]
    blob = pack_data(datas, [size] * batch)
    append = (files("streamsub._backends.redis") / "scripts" / "append.lua").read_text()
    sha = {
        "append": await client.script_load(append),
        "lua-xadd": await client.script_load(LUA_XADD),
        "lua-call": await client.script_load(LUA_CALL),
    }
    written = 0

    async def append_write() -> object:
        return await client.evalsha(sha["append"], 1, STREAM, blob)  # type: ignore[misc]

    async def append_linked() -> object:
        nonlocal written
        written += 1
        behind = written - 1 if written > 1 else ""
        return await client.evalsha(sha["append"], 2, STREAM, LINK, blob, written, behind)  # type: ignore[misc]

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
        "lua-xadd": lua_xadd,
        "lua-call": lua_call,
        "pipelined": pipelined,
        "multi": multi,
    }
    cpu: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        for round_no in range(rounds):
            order = list(WAYS) if round_no % 2 == 0 else list(reversed(WAYS))
            for way in order:
                await client.delete(STREAM, LINK)
                await client.xadd(STREAM, {"d": b"first"})
                written = 0
                before = await _server_cpu(client)
                for _ in range(batches):
                    await write[way]()
                after = await _server_cpu(client)
                cpu[way].append((after - before) * 1e6 / (batch * batches))
                print(f"round {round_no + 1} {way:<14} {cpu[way][-1]:.3f} µs a message", flush=True)
    finally:
        await client.aclose()
    return cpu


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
    with servers.redis_server(path) as url:
        cpu = asyncio.run(measure(url, args.batch, args.batches, args.size, args.rounds))
    print(
        f"\nredis-server CPU a message (µs), medians of {args.rounds} rounds of "
        f"{args.batches:,} writes of {args.batch}:"
    )
    floor = statistics.median(cpu["pipelined"])
    for way in WAYS:
        median = statistics.median(cpu[way])
        spread = ", ".join(f"{value:.2f}" for value in cpu[way])
        print(f"  {way:<14} {median:.2f}  ({median / floor:.2f}x pipelined; rounds {spread})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
