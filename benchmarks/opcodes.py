"""Python opcodes a message, by function: where an awaited ``publish()``'s Python goes.

Usage (from the repository root)::

    .venv/bin/python benchmarks/opcodes.py                 # 500 callers
    .venv/bin/python benchmarks/opcodes.py --callers 100 --top 30

N callers each await ``client.publish()`` of 100 B on a 16-partition topic
(as ``run.py --scenarios workers``), against a private redis-server, in this
process. A warm-up round runs untraced; then a round of ``--messages`` runs
under ``sys.settrace`` with opcode events on, and every opcode executed is
counted against the function (file and name) whose frame ran it. Printed:
opcodes a message in all, and per function, the most first.

Counts, not times: the same code and the same batching give the same counts
whatever else the machine is doing (the batching follows the callers' turns
and the replies' timing, so they move a little between runs: compare
functions, not single opcodes). An opcode is not a fixed cost (a call or a
dict lookup costs more than a local load, and C functions run no opcodes);
``instructions.py`` counts what all of it costs, this says where in the
Python it goes. Tracing makes the round about 20 times slower.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from pathlib import Path
from types import FrameType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for entry in (str(BENCH_DIR), str(BENCH_DIR.parent / "src")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import servers  # noqa: E402
import streamsub  # noqa: E402

BODY = b"x" * 100
TOPIC = "bench"
Counts = collections.Counter[tuple[str, str]]


async def _round(url: str, callers: int, n: int, counts: Counts | None) -> None:
    async with streamsub.connect(url) as client:
        await client.publish(TOPIC, BODY)  # the topic looked up, the connection made
        sequence = iter(range(n))

        def tracer(frame: FrameType, event: str, arg: Any) -> Any:
            frame.f_trace_opcodes = True
            if event == "opcode" and counts is not None:
                code = frame.f_code
                counts[(Path(code.co_filename).name, code.co_name)] += 1
            return tracer

        async def caller() -> None:
            if counts is not None:
                sys.settrace(tracer)  # each task's steps: the trace is per thread and frame
            for _ in sequence:
                await client.publish(TOPIC, BODY)

        if counts is not None:
            sys.settrace(tracer)
        try:
            await asyncio.gather(*(caller() for _ in range(callers)))
        finally:
            sys.settrace(None)


async def main(args: argparse.Namespace) -> None:
    path = servers.find_binary("redis-server")
    if path is None:
        raise SystemExit("redis-server not found")
    counts: Counts = collections.Counter()
    with servers.redis_server(path) as url:
        async with streamsub.connect(url) as client:
            await client.create_topic(TOPIC, partitions=16)
        await _round(url, args.callers, 2_000, None)
        await _round(url, args.callers, args.messages, counts)
    total = sum(counts.values())
    print(
        f"{args.callers} callers awaiting publish(), {args.messages:,} messages: "
        f"{total / args.messages:,.1f} opcodes a message"
    )
    for (filename, function), count in counts.most_common(args.top):
        print(f"{count / args.messages:8.1f}  {filename}:{function}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, default=500)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
