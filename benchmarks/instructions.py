"""Instructions a message: the client's own work on a path, counted, not timed.

On a shared, noisy 2-core machine a 5 % change of the client's CPU is lost
in the run-to-run spread of msgs/s. The instructions the client process
executes are not: valgrind's callgrind counts them exactly (its total
``Ir``), and other load does not add to them. What the client does can still
depend on timing (how a call's chunks or a read's entries fall), so counts of
the same code repeat to within a few in ten thousand on some paths (500
callers: 31,527 to 31,531 in three runs), to about 0.5 % for
``publish_many`` of 100 (13,473 to 13,543) and ~1.5 % for ``consume``: a
smaller difference is not a change.

Each path runs twice in a fresh interpreter under callgrind, with
``--small`` and with ``--large`` messages, against a native
``redis-server`` (started here: a free port, a temporary directory, nothing
saved); the difference of the two counts over the difference of the message
counts is the instructions one message costs, start-up and shut-down
cancelled out. The server is not counted.

Paths (100-byte messages, a 16-partition topic):

* ``each``: one caller awaiting each ``publish()``; ``xadd``: one redis-py
  ``XADD`` awaited each time instead (the hand-written baseline of ``each``);
* ``workers500``: 500 callers, each awaiting ``publish()`` in a loop;
* ``many100``, ``many1000``: ``publish_many`` of 100 or 1,000
  ``OutgoingMessage``, one call after the other;
* ``pipelined``: the hand-written loop, ``XADD`` pipelined 200 at a time;
* ``futures500``: 500 workers each awaiting a bare future that a task
  resolves once a loop iteration, no server: what any awaited call costs,
  the floor under ``workers500``;
* ``consume``: one subscriber (``FlowControl(max_messages=1000)``, an
  ``async def`` handler keeping each body) taking a backlog published before
  it starts; ``consume-handwritten``: ``XREADGROUP COUNT 500`` and one
  ``XACK`` a batch, as ``impls/handwritten.py`` consumes.

Usage (from the repository root; needs ``valgrind``: ``apt-get install
valgrind``)::

    .venv/bin/python benchmarks/instructions.py
    .venv/bin/python benchmarks/instructions.py --paths each,workers500 --compare 67a0c2f

``--compare REV`` counts the streamsub paths of another git revision too
(``git archive`` into a temporary directory, put first on ``sys.path``), for
a before and after. Under callgrind a process runs about 50 times slower: the
default sizes (2,000 and 12,000 messages; a tenth of that for ``each`` and
``xadd``, whose round trips cost far more) take a minute or so a path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
PATHS = (
    "each",
    "xadd",
    "workers500",
    "many100",
    "many1000",
    "pipelined",
    "futures500",
    "consume",
    "consume-handwritten",
)
HANDWRITTEN = ("xadd", "pipelined", "futures500", "consume-handwritten")
"""Paths that do not run streamsub: counted once, not per revision."""
ROUND_TRIP_PATHS = ("each", "xadd")
BODY = b"x" * 100
TOPIC = "bench"
SUBSCRIPTION = "bench-sub"


# --- the child: one path, n messages ------------------------------------------
async def _child(path: str, n: int, url: str) -> None:
    import redis.asyncio as aioredis

    if path == "futures500":
        sys.path.insert(1, str(BENCH_DIR))  # behind --src: streamsub stays that tree's
        from publish_profile import bare_futures

        await bare_futures(n, 500)
        return
    if path in HANDWRITTEN:
        redis = aioredis.Redis.from_url(url)
        try:
            if path == "xadd":
                for seq in range(n):
                    await redis.xadd(f"s{seq % 16}", {"d": BODY})
            elif path == "pipelined":
                for base in range(0, n, 200):
                    pipe = redis.pipeline(transaction=False)
                    for seq in range(base, min(base + 200, n)):
                        pipe.xadd(f"s{seq % 16}", {"d": BODY})
                    await pipe.execute()
            else:
                seen: list[bytes] = []
                while len(seen) < n:
                    reply = await redis.xreadgroup("g", "c", {"s": ">"}, count=500, block=1000)
                    for _, entries in reply:
                        seen += [fields[b"d"] for _, fields in entries]
                        await redis.xack("s", "g", *[entry_id for entry_id, _ in entries])
        finally:
            await redis.aclose()
        return

    import streamsub

    async with streamsub.connect(url) as client:
        if path == "each":
            for _ in range(n):
                await client.publish(TOPIC, BODY)
        elif path.startswith("workers"):
            sequence = iter(range(n))

            async def worker() -> None:
                for _ in sequence:
                    await client.publish(TOPIC, BODY)

            await asyncio.gather(*(worker() for _ in range(int(path.removeprefix("workers")))))
        elif path.startswith("many"):
            per_call = int(path.removeprefix("many"))
            for base in range(0, n, per_call):
                chunk = [
                    streamsub.OutgoingMessage(data=BODY) for _ in range(min(per_call, n - base))
                ]
                await client.publish_many(TOPIC, chunk)
        elif path == "consume":
            done = asyncio.Event()
            kept: list[bytes] = []

            async def handler(message: streamsub.Message) -> None:
                kept.append(message.data)
                if len(kept) >= n:
                    done.set()

            flow = streamsub.FlowControl(max_messages=1000)
            async with client.subscribe(SUBSCRIPTION, handler, flow_control=flow):
                await done.wait()
        else:
            raise SystemExit(f"unknown path {path!r}")


async def _prepare(path: str, n: int, url: str) -> None:
    """Empty the server; make the topic (and for ``consume`` its backlog of n)."""
    import redis.asyncio as aioredis

    import streamsub

    redis = aioredis.Redis.from_url(url)
    try:
        await redis.flushall()
        if path == "consume-handwritten":
            await redis.xgroup_create("s", "g", "0", mkstream=True)
            for base in range(0, n, 200):
                pipe = redis.pipeline(transaction=False)
                for _ in range(base, min(base + 200, n)):
                    pipe.xadd("s", {"d": BODY})
                await pipe.execute()
    finally:
        await redis.aclose()
    if path in HANDWRITTEN:
        return
    async with streamsub.connect(url) as client:
        await client.create_topic(TOPIC, partitions=16)
        if path == "consume":
            await client.create_subscription(SUBSCRIPTION, topic=TOPIC)
            for base in range(0, n, 1000):
                await client.publish_many(TOPIC, [BODY] * min(1000, n - base))


# --- the parent -------------------------------------------------------------------
def _run(src: Path, args: list[str], *, valgrind: bool) -> int:
    """Run this script as a child on ``src``'s streamsub; its instruction count
    under callgrind (0 without)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--src", str(src), *args]
    if valgrind:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    if not valgrind:
        return 0
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from callgrind:\n{done.stderr[-2000:]}")
    return int(found[1])


def _count(src: Path, path: str, sizes: tuple[int, int], url: str) -> int:
    """Instructions a message of ``path`` on ``src``'s streamsub."""
    counts = []
    for n in sizes:
        _run(src, ["--prepare", path, str(n), url], valgrind=False)
        counts.append(_run(src, ["--child", path, str(n), url], valgrind=True))
    return round((counts[1] - counts[0]) / (sizes[1] - sizes[0]))


def _extract(revision: str, into: Path) -> Path:
    """``revision``'s src/ (``git archive``) under ``into``; the src directory."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "src"], capture_output=True, check=True
    ).stdout
    tar = into / "tree.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as opened:
        opened.extractall(into, filter="data")
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--compare", metavar="REV", help="count another revision's paths too")
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--large", type=int, default=12000)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.src is not None:  # a child: streamsub from --src, first on the path
        sys.path.insert(0, args.src)
        which, n, url = args.child or args.prepare
        asyncio.run((_child if args.child else _prepare)(which, int(n), url))
        return

    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        raise SystemExit(f"unknown paths {unknown}; the paths are {', '.join(PATHS)}")
    sys.path.insert(0, str(BENCH_DIR))
    import servers

    binary = servers.find_binary("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: apt-get install redis-server")
    with tempfile.TemporaryDirectory(prefix="streamsub-instructions-") as tmp:
        trees: dict[str, Path] = {"this tree": ROOT / "src"}
        if args.compare:
            trees = {args.compare: _extract(args.compare, Path(tmp)), **trees}
        with servers.redis_server(binary) as url:
            print(f"instructions a message ({args.small:,} and {args.large:,} messages):")
            for path in paths:
                sizes = (args.small, args.large)
                if path in ROUND_TRIP_PATHS:
                    sizes = (args.small // 10, args.large // 10)
                counted: dict[str, Any] = {}
                if path in HANDWRITTEN:  # no streamsub in it: counted once
                    counted["hand-written"] = _count(ROOT / "src", path, sizes, url)
                else:
                    for name, src in trees.items():
                        counted[name] = _count(src, path, sizes, url)
                figures = " · ".join(f"{name} {count:,}" for name, count in counted.items())
                print(f"  {path:<20} {figures}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
