"""Side measurement: starting a trivial ``async def`` handler eagerly vs in a task.

No Redis, no streamsub: only the two ways of starting a handler coroutine, per
message, on one event loop --

* ``eager`` -- what streamsub 0.1 did for a handler that does not suspend: copy
  the context and run the coroutine's first (here: only) step inline;
* ``task``  -- what streamsub did until 2026-12-06: ``loop.create_task`` per
  message, a done callback that forgets the task, and the loop iterations that
  run them (in batches of 500, like a read);
* ``runners`` -- what streamsub does now: ``streamsub._engine.runners.Runners``,
  the same batches submitted to the pool of runner tasks.

``--handler suspend`` makes the handler ``await asyncio.sleep(0)`` once (a
handler waiting on I/O suspends at least once); ``--handler timeout`` runs it
inside ``asyncio.timeout``.

Usage: ``.venv/bin/python benchmarks/dispatch_micro.py [--messages N] [--repeat R]
[--handler trivial|suspend|timeout]``. Prints the median cost of each per
message and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from streamsub._engine.runners import Runners

BATCH = 500

Handler = Callable[[int], Coroutine[Any, Any, None]]


def make_handler(kind: str = "trivial") -> Handler:
    seen = [0]

    async def trivial(message: int) -> None:
        seen[0] += 1

    async def suspend(message: int) -> None:
        await asyncio.sleep(0)
        seen[0] += 1

    async def timeout(message: int) -> None:
        async with asyncio.timeout(5):  # noqa: ASYNC100 - its own cost is measured
            seen[0] += 1

    return {"trivial": trivial, "suspend": suspend, "timeout": timeout}[kind]


async def eager(handler: Handler, n: int) -> None:
    for i in range(n):
        coro = handler(i)
        try:  # noqa: SIM105 - contextlib.suppress costs more than what is measured
            contextvars.copy_context().run(coro.send, None)
        except StopIteration:
            pass


async def task(handler: Handler, n: int) -> None:
    loop = asyncio.get_running_loop()
    live: set[asyncio.Task[None]] = set()

    async def run(message: int) -> None:
        try:  # noqa: SIM105 - as a dispatcher would, minus the reporting
            await handler(message)
        except Exception:
            pass

    for base in range(0, n, BATCH):
        for i in range(base, min(base + BATCH, n)):
            started = loop.create_task(run(i))
            live.add(started)
            started.add_done_callback(live.discard)
        while live:  # noqa: ASYNC110 - only yield to the loop; waiting would add callbacks
            await asyncio.sleep(0)


async def runners(handler: Handler, n: int) -> None:
    done = 0

    async def run(message: int) -> None:
        nonlocal done
        try:  # noqa: SIM105 - as a dispatcher would, minus the reporting
            await handler(message)
        except Exception:
            pass
        done += 1

    pool: Runners[int] = Runners(run, contextvars.copy_context())
    for base in range(0, n, BATCH):
        pool.submit(range(base, min(base + BATCH, n)))
        while done < min(base + BATCH, n):  # noqa: ASYNC110 - as task() waits
            await asyncio.sleep(0)
    pool.close()


async def main(n: int, repeat: int, kind: str) -> None:
    starts = {"eager": eager, "task": task, "runners": runners}
    if kind != "trivial":  # eager runs only a first step
        del starts["eager"]
    costs: dict[str, list[float]] = {name: [] for name in starts}
    for _ in range(repeat):  # interleaved, like the harness's rounds
        for name, start in starts.items():
            began = time.perf_counter()
            await start(make_handler(kind), n)
            costs[name].append((time.perf_counter() - began) / n * 1e6)
    medians = {name: statistics.median(values) for name, values in costs.items()}
    for name, values in costs.items():
        rounds = " · ".join(f"{v:.2f}" for v in values)
        print(f"{name:<7} median {medians[name]:.2f} us/message  (rounds: {rounds})")
    if "eager" in medians:
        print(f"task / eager = {medians['task'] / medians['eager']:.1f}x")
    print(f"task / runners = {medians['task'] / medians['runners']:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--handler", choices=["trivial", "suspend", "timeout"], default="trivial")
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.repeat, args.handler))
