"""A subscriber process for the crash tests: records every message it handles.

Usage: python -m tests.faults._subscriber URL SUBSCRIPTION CONSUMER OUTPUT

Each handled message is written to OUTPUT as "message_id attempt unix_time"
before the handler returns (so before streamsub acks it), unbuffered, so a
SIGKILL loses no record of an acknowledged message. "ready" is written once
the subscriber runs.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

import streamsub


async def main(url: str, subscription: str, consumer: str, output: str) -> None:
    fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def handler(message: streamsub.Message) -> None:
        await asyncio.sleep(random.uniform(0.001, 0.005))
        line = f"{message.message_id} {message.delivery_attempt} {time.time():.6f}\n"
        os.write(fd, line.encode())

    async with (
        streamsub.connect(url) as client,
        client.subscribe(
            subscription,
            handler,
            consumer=consumer,
            flow_control=streamsub.FlowControl(max_messages=20),
        ),
    ):
        os.write(fd, b"ready\n")
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
