"""A subscriber process of an ordered subscription, for the ordering crash test.

Usage: python -m tests.faults._ordered_subscriber URL SUBSCRIPTION CONSUMER

Each handled message is recorded, before the handler returns (so before it is
acked), as "key index attempt consumer" at the tail of the Redis list
``test:handled``: one list in handling order across every process. "ready" goes
to stdout once the subscriber runs.
"""

from __future__ import annotations

import asyncio
import random
import sys

import redis.asyncio as aioredis

import streamsub


async def main(url: str, subscription: str, consumer: str) -> None:
    journal = aioredis.Redis.from_url(url)

    async def handler(message: streamsub.Message) -> None:
        key, index = message.data.decode().split(":")
        await asyncio.sleep(random.uniform(0, 0.002))
        await journal.rpush("test:handled", f"{key} {index} {message.delivery_attempt} {consumer}")

    async with (
        streamsub.connect(url) as client,
        client.subscribe(
            subscription,
            handler,
            consumer=consumer,
            flow_control=streamsub.FlowControl(max_messages=200),
        ),
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
