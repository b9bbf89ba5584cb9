"""Redis's own time per message, by command, in the saturated end-to-end round.

Each round runs ``run.py``'s e2e scenario for one implementation (a consumer
process and, once it is subscribed, a publisher process, both freshly spawned)
against one private redis-server, after ``CONFIG RESETSTAT``; then reads the
server's ``INFO commandstats`` (the microseconds each command ran; a script's
time includes the commands it calls, which are listed too) and ``INFO cpu`` (everything
redis-server did: commands, and the reading, parsing and replying around
them), each divided by the round's messages. Rounds interleave the
implementations; the tables show medians.

What the e2e figure's peers cost Redis, beside what they cost their own
processes (``receive_profile.py``): on two cores shared by the publisher, the
consumer and redis-server, Redis's CPU per message is part of each message's
wall time.

Usage::

    .venv/bin/python benchmarks/commandstats.py --messages 200000 --rounds 3
    .venv/bin/python benchmarks/commandstats.py --only handwritten,streamsub,faststream
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
for entry in (str(BENCH_DIR), str(BENCH_DIR.parent / "src")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from redis.asyncio import Redis  # noqa: E402

import servers  # noqa: E402
from impls import instantiate, load_available  # noqa: E402
from impls.base import Env, Implementation  # noqa: E402


async def one_round(
    impl: Implementation, url: str, n: int, size: int, timeout: float
) -> tuple[dict[str, float], float, float]:
    """(microseconds of each command per message, redis-server's CPU
    microseconds per message, messages a second end to end) of one e2e round."""
    await impl.flush()
    await impl.reset()
    await impl.setup()
    client = Redis.from_url(url)
    try:
        await client.config_resetstat()
        cpu_before = await servers.cpu_seconds(client)
        result = await impl.end_to_end(n, size, timeout)
        stats = await client.info("commandstats")
        cpu = await servers.cpu_seconds(client) - cpu_before
    finally:
        await client.aclose()
    per_command = {
        name.removeprefix("cmdstat_"): float(fields["usec"]) / n
        for name, fields in stats.items()
        if not name.startswith("cmdstat_config")
    }
    return per_command, cpu * 1e6 / n, n / result.elapsed_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--only", default="handwritten,streamsub")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    classes, skipped = load_available(args.only.split(","))
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    redis_path = servers.find_binary("redis-server")
    if redis_path is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    n: int = args.messages
    rounds: dict[str, list[tuple[dict[str, float], float, float]]] = collections.defaultdict(list)
    with servers.redis_server(redis_path) as url:
        impls = instantiate(classes, Env(redis_url=url))
        for r in range(args.rounds):
            order = list(impls) if r % 2 == 0 else list(reversed(impls))
            for name in order:
                one = asyncio.run(one_round(impls[name], url, n, args.size, args.timeout))
                rounds[name].append(one)
                print(
                    f"round {r + 1} {name}: {one[2]:,.0f} msgs/s; "
                    f"redis-server CPU {one[1]:.2f} us a message",
                    flush=True,
                )
    for name, results in rounds.items():
        commands = {command for per_command, _, _ in results for command in per_command}
        median = {c: statistics.median(r[0].get(c, 0.0) for r in results) for c in commands}
        shown = sorted((c for c in commands if median[c] >= 0.005), key=lambda c: -median[c])
        print(
            f"\n{name}, medians of {len(results)} rounds of {n:,} messages: "
            f"{statistics.median(r[2] for r in results):,.0f} msgs/s end to end; "
            f"redis-server CPU {statistics.median(r[1] for r in results):.2f} us a message"
        )
        print("| command | us a message |\n|---|---:|")
        for command in shown:
            print(f"| `{command}` | {median[command]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
