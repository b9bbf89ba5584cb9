"""A subscriber process of an ordered subscription, for the ordering fault tests.

Usage: python -m tests.faults._ordered_subscriber URL SUBSCRIPTION CONSUMER [STALL]

Each handled message is recorded, before the handler returns (so before it is
acked), as "key index attempt consumer" at the tail of the Redis list
``test:handled``: one list in handling order across every process. The list
``test:events`` gets "key index consumer start" as a handler begins and "...
end" once its record is in, both confirmed by Redis before the handler goes
on: a key's handlers overlapped if two starts come without an end between. "ready" goes
to stdout once the subscriber runs.

With STALL (seconds), the process stalls once the way a handler can stall a
whole event loop — a blocking ``time.sleep`` in an ``async def`` handler — in
the first message it handles with index 20 or more, after setting the Redis
key ``test:stalled``. Its handlers then record as they start, with a blocking
call, so that every handler that ran before the stall is recorded before it.
A handler given its message before the stall (the subscriber's dispatcher
started it) that had not yet run starts right after: it records as consumer
``<CONSUMER>-pre``; one given its message after the stall records as
``<CONSUMER>``.
$STREAMSUB_TEST_OWNERSHIP_LEASE sets the partition lease (seconds).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

import redis.asyncio as aioredis

import streamsub
from streamsub._engine import ownership
from streamsub._engine.dispatcher import Dispatcher
from tests._layout import inspector, node_url_for_key


async def main(url: str, subscription: str, consumer: str, stall: float) -> None:
    # Plain clients on the nodes of the journal's keys: redis-py's asyncio cluster
    # client, under a few hundred concurrent commands, now and then failed one
    # with "Connection closed by server" (reproduced without streamsub) and sent
    # it again, recording a handling twice.
    handled = aioredis.Redis.from_url(node_url_for_key(url, "test:handled"))
    events = aioredis.Redis.from_url(node_url_for_key(url, "test:events"))
    blocking_journal = inspector(url)
    stall_state = {"stalled": False, "resumed": False}
    given_before: set[tuple[str, int]] = set()
    """(message id, delivery attempt) of each message started before the stall
    ended, as the dispatcher was given it."""
    start = Dispatcher.start

    def start_noting(self: Dispatcher, messages: list[streamsub.Message]) -> None:
        if not stall_state["resumed"]:
            given_before.update((m.message_id, m.delivery_attempt) for m in messages)
        start(self, messages)

    Dispatcher.start = start_noting  # type: ignore[method-assign]

    async def handler(message: streamsub.Message) -> None:
        key, index = message.data.decode().split(":")
        record = f"{key} {index} {message.delivery_attempt} {consumer}"
        await events.rpush("test:events", f"{key} {index} {consumer} start")
        await asyncio.sleep(random.uniform(0, 0.002))
        await handled.rpush("test:handled", record)
        await events.rpush("test:events", f"{key} {index} {consumer} end")

    async def stalling_handler(message: streamsub.Message) -> None:
        key, index = message.data.decode().split(":")
        given = (message.message_id, message.delivery_attempt)
        pre = stall_state["resumed"] and given in given_before
        who = f"{consumer}-pre" if pre else consumer
        blocking_journal.rpush("test:handled", f"{key} {index} {message.delivery_attempt} {who}")
        if not stall_state["stalled"] and int(index) >= 20:
            stall_state["stalled"] = True
            blocking_journal.set("test:stalled", consumer)
            time.sleep(stall)  # noqa: ASYNC251 (the point: the loop stops, renewals too)
            stall_state["resumed"] = True
        await asyncio.sleep(random.uniform(0, 0.002))

    async with (
        streamsub.connect(url) as client,
        client.subscribe(
            subscription,
            stalling_handler if stall else handler,
            consumer=consumer,
            flow_control=streamsub.FlowControl(max_messages=200),
        ),
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()  # until killed


def check_one_at_a_time(events: list[bytes], killed: str) -> None:
    """Assert that each key's handlers ran one at a time: after a start, the next
    event of the key is that handler's end, but where ``killed`` started a
    handler that never ended."""
    running: dict[str, tuple[str, str]] = {}
    for raw in events:
        key, index, consumer, what = raw.decode().split()
        if what == "start":
            if key in running:
                assert running[key][1] == killed, f"{key}: {running[key]} and {index} at once"
            running[key] = (index, consumer)
        else:
            assert running.pop(key, None) == (index, consumer), f"{key}: {index} ended unstarted"


def check_key(records: list[tuple[int, int, str]], killed: str) -> int:
    """Assert one key's handlings keep publish order; return its restarts.

    ``records`` are (index, delivery attempt, consumer) in handling order. Each
    handling is the next message of the key, but for a restart: the new owner of
    a partition that ``killed`` (crashed or stalled) held handles again (delivery
    > 1) what it held, from the earliest such message on, before anything later,
    and goes on in order from there. A restart follows only a handling by
    ``killed``."""
    expected, restarts, previous = 0, 0, ""
    for index, attempt, consumer in records:
        if index < expected:
            assert attempt > 1, f"{index} handled twice on its first delivery ({consumer})"
            assert previous == killed, f"{index} handled again after {previous}, not a crash"
            restarts += 1
        else:
            assert index == expected, f"{index} handled before {expected} ({consumer})"
        expected, previous = index + 1, consumer
    return restarts


if __name__ == "__main__":
    if "STREAMSUB_TEST_OWNERSHIP_LEASE" in os.environ:
        ownership.OWNERSHIP_LEASE = float(os.environ["STREAMSUB_TEST_OWNERSHIP_LEASE"])
    asyncio.run(main(*sys.argv[1:4], float(sys.argv[4]) if len(sys.argv) > 4 else 0.0))
