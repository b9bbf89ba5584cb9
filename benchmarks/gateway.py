"""The official Pub/Sub Python client through the streamsub gateway, next to
streamsub's native API, in one run against one private redis-server.

Usage (from the repository root, with the ``gateway`` extra installed)::

    .venv/bin/python benchmarks/gateway.py                 # 20,000 msgs, 3 rounds, 100 B
    .venv/bin/python benchmarks/gateway.py --messages 5000 --rounds 1

Two scenarios, each run ``--rounds`` times, the two ways alternating:

- **publish**: n messages published as fast as the API allows (native:
  ``publish_many`` in chunks of 1000; official client: ``publish`` for each
  message, then every future's result); throughput = n / time until the last
  message is confirmed.
- **receive**: n messages already in a fresh subscription are received and
  acked (native: ``subscribe`` with an async handler; official client:
  ``subscribe`` streaming pull with its default flow control); throughput = n /
  time until the last distinct message was handled.

The gateway runs as its own ``streamsub gateway`` process; the clients run in
this one. Medians and the ratio gateway/native are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import streamsub
from streamsub.testing import redis_server

sys.path.insert(0, str(Path(__file__).parent))
from servers import free_port


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    return parser.parse_args()


def start_gateway(url: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    command = Path(sys.executable).parent / "streamsub"
    process = subprocess.Popen(
        [str(command), "gateway", "--redis", url, "--grpc", f"127.0.0.1:{port}", "--http", "off"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        if "gRPC on" in line:
            break
    else:
        raise RuntimeError("the gateway did not start")
    threading.Thread(target=lambda: [None for _ in process.stderr or ()], daemon=True).start()
    return process, f"127.0.0.1:{port}"


async def native_publish(url: str, topic: str, n: int, body: bytes) -> float:
    async with streamsub.connect(url) as client:
        await client.create_topic(topic)
        started = time.perf_counter()
        for start in range(0, n, 1000):
            await client.publish_many(topic, [body] * min(1000, n - start))
        return n / (time.perf_counter() - started)


def gateway_publish(topic: str, n: int, body: bytes) -> float:
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    publisher.create_topic(name=topic)
    started = time.perf_counter()
    futures = [publisher.publish(topic, body) for _ in range(n)]
    for future in futures:
        future.result()
    elapsed = time.perf_counter() - started
    publisher.stop()
    return n / elapsed


async def native_receive(url: str, name: str, n: int, body: bytes) -> float:
    async with streamsub.connect(url) as client:
        await client.create_topic(name)
        await client.create_subscription(name, topic=name)
        for start in range(0, n, 1000):
            await client.publish_many(name, [body] * min(1000, n - start))
        seen: set[str] = set()
        done = asyncio.Event()

        async def handler(message: streamsub.Message) -> None:
            seen.add(message.message_id)
            if len(seen) >= n:
                done.set()

        started = time.perf_counter()
        async with client.subscribe(name, handler):
            await asyncio.wait_for(done.wait(), 600)
            elapsed = time.perf_counter() - started
        return n / elapsed


def gateway_receive(project: str, n: int, body: bytes) -> float:
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic = f"projects/{project}/topics/receive"
    name = f"projects/{project}/subscriptions/receive"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic)
    for future in [publisher.publish(topic, body) for _ in range(n)]:
        future.result()
    seen: set[str] = set()
    lock = threading.Lock()
    done = threading.Event()

    def callback(message: Any) -> None:
        message.ack()
        with lock:
            seen.add(message.message_id)
            if len(seen) >= n:
                done.set()

    started = time.perf_counter()
    future = subscriber.subscribe(name, callback)
    if not done.wait(600):
        raise RuntimeError(f"received {len(seen)} of {n}")
    elapsed = time.perf_counter() - started
    future.cancel()
    future.result(timeout=60)
    subscriber.close()
    publisher.stop()
    return n / elapsed


def main() -> None:
    args = parse_args()
    body = os.urandom(args.size)
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as directory, redis_server(Path(directory)) as server:
        gateway, host = start_gateway(server.url)
        os.environ["PUBSUB_EMULATOR_HOST"] = host
        try:
            for round_number in range(args.rounds):
                tag = f"r{round_number}-{time.monotonic_ns()}"
                figures = {
                    ("publish", "native"): asyncio.run(
                        native_publish(server.url, f"bench-{tag}", args.messages, body)
                    ),
                    ("publish", "gateway"): gateway_publish(
                        f"projects/bench/topics/publish-{tag}", args.messages, body
                    ),
                    ("receive", "native"): asyncio.run(
                        native_receive(server.url, f"recv-{tag}", args.messages, body)
                    ),
                    ("receive", "gateway"): gateway_receive(f"bench-{tag}", args.messages, body),
                }
                for key, value in figures.items():
                    results.setdefault(key, []).append(value)
                    print(f"round {round_number + 1}: {key[0]:8} {key[1]:8} {value:10,.0f} msgs/s")
        finally:
            gateway.terminate()
            gateway.wait(30)
    print()
    print(f"{args.messages:,} messages of {args.size} B, median of {args.rounds} rounds")
    print("| scenario | native msgs/s | official client via gateway msgs/s | gateway / native |")
    print("|---|---|---|---|")
    for scenario in ("publish", "receive"):
        native = statistics.median(results[(scenario, "native")])
        through = statistics.median(results[(scenario, "gateway")])
        print(f"| {scenario} | {native:,.0f} | {through:,.0f} | {through / native:.2f} |")


if __name__ == "__main__":
    main()
