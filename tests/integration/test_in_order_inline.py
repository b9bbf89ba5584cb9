"""The in-order connection's callers that read their own replies (``inline``):
the publisher's writes, which so save the reader task's trips through the
event loop. Many callers at once, alone, cancelled while they read, and past
the socket timeout, against the real test server."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from streamsub._backends.redis._in_order import InOrderConnection
from streamsub.testing import RedisServer
from tests._wait import until

pytestmark = pytest.mark.standalone  # one server's connection, not a cluster's


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


async def _reading(
    connection: InOrderConnection, seconds: str, behind: list[bool], count: int = 1
) -> tuple[asyncio.Task[list[Any]], list[asyncio.Task[list[Any]]]]:
    """A caller reading its own reply to a BLPOP of ``seconds`` and, once it
    reads, a call of ``count`` INCRs sent behind it for each of ``behind``
    (whether its caller reads too)."""
    first = asyncio.ensure_future(
        connection.call_many([("BLPOP", "nothing-here", seconds)], inline=True)
    )
    await until(lambda: connection._inline, 5, "the first caller reading its own reply")
    calls = [
        asyncio.ensure_future(connection.call_many([("INCR", "behind")] * count, inline=inline))
        for inline in behind
    ]
    return first, calls


async def test_callers_reading_their_own_replies_each_get_theirs_in_order(
    client: aioredis.Redis,
) -> None:
    """40 callers, half reading their own replies and half leaving them to the
    reader task, each sending 5 calls of 25 INCRs of one counter, some in the
    same step and some a moment apart: every call gets its own 25 replies,
    consecutive (its commands ran together, in order), and the replies are
    1 to 5,000, each once. No reader is left behind."""
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    got: list[list[int]] = []

    async def caller(n: int) -> None:
        rng = random.Random(n)
        inline = n % 2 == 0
        for _ in range(5):
            if rng.random() < 0.5:
                await asyncio.sleep(rng.random() / 500)
            replies = await connection.call_many([("INCR", "inline")] * 25, inline=inline)
            got.append([int(reply) for reply in replies])

    try:
        async with asyncio.timeout(20):
            await asyncio.gather(*(caller(n) for n in range(40)))
        for replies in got:
            assert replies == list(range(replies[0], replies[0] + 25)), replies
        assert sorted(r for replies in got for r in replies) == list(range(1, 5001))
        await asyncio.sleep(0)
        assert not connection._inline
        assert connection._reader is None or connection._reader.done()
        assert not connection._waiting
    finally:
        await connection.close()


async def test_a_caller_alone_reads_its_replies_without_a_reader_task(
    client: aioredis.Redis,
) -> None:
    """One caller awaiting each call in turn (a lone publisher) reads each
    reply itself: no reader task is ever started for it."""
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    try:
        for n in range(1, 101):
            assert await connection.call_many([("INCR", "alone")], inline=True) == [n]
            await asyncio.sleep(0)  # the end-of-step check for a reader ran
        assert connection._reader is None
    finally:
        await connection.close()


@pytest.mark.parametrize("inline", [True, False], ids=["reading", "leaving it"])
async def test_calls_sent_behind_a_caller_that_reads_get_their_replies(
    client: aioredis.Redis, inline: bool
) -> None:
    """While a caller reads its own reply (a BLPOP that waits 0.2 s), three
    calls are sent behind it, their callers reading too or not: once the
    first caller has its reply it leaves the rest to a reader task, and each
    call gets its own reply."""
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    try:
        first, behind = await _reading(connection, "0.2", [inline] * 3, count=3)
        async with asyncio.timeout(2):
            assert await first == [None]
            results = await asyncio.gather(*behind)
        assert sorted(results) == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
        assert connection._reader is not None, "the rest was left to a reader task"
    finally:
        await connection.close()


async def test_a_caller_cancelled_while_it_reads_fails_the_calls_behind_it(
    client: aioredis.Redis,
) -> None:
    """A caller reading its own reply (a BLPOP that waits 2 s) is cancelled:
    the reply was cut, so the connection is dropped and the three calls sent
    behind it fail at once with ConnectionError (their outcome unknown), none
    waits for the BLPOP; the next call goes on a new connection."""
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    try:
        reading, behind = await _reading(connection, "2", [True, False, True])
        await until(lambda: len(connection._waiting) == 4, 5, "the calls behind it sent")
        started = time.monotonic()
        reading.cancel()
        async with asyncio.timeout(1):
            with pytest.raises(asyncio.CancelledError):
                await reading
            results = await asyncio.gather(*behind, return_exceptions=True)
        assert time.monotonic() - started < 1
        for result in results:
            assert isinstance(result, list), result
            assert isinstance(result[0], redis.ConnectionError), result
        assert await connection.call_many([("PING",)], inline=True) == [b"PONG"]
    finally:
        await connection.close()


async def test_a_caller_reading_its_replies_keeps_the_socket_timeout(
    client: aioredis.Redis,
) -> None:
    """A caller reading its own reply waits at most the socket timeout (0.3 s)
    for it: a BLPOP of 2 s fails with TimeoutError, so does the call behind
    it, and the next call goes on a new connection."""
    connection = InOrderConnection(client, timeout=0.3, health_check_interval=3600.0)
    try:
        started = time.monotonic()
        first, (second,) = await _reading(connection, "2", [True])
        async with asyncio.timeout(2):
            (reply,) = await first
            (behind,) = await second
        assert isinstance(reply, redis.TimeoutError), reply
        assert isinstance(behind, redis.TimeoutError | redis.ConnectionError), behind
        assert time.monotonic() - started < 1.0
        assert await connection.call_many([("PING",)], inline=True) == [b"PONG"]
    finally:
        await connection.close()


async def test_closing_while_a_caller_reads_fails_its_call_and_those_behind(
    client: aioredis.Redis,
) -> None:
    """The connection is closed while a caller reads its own reply (a BLPOP
    that waits 2 s) with two calls sent behind it: all three calls end at
    once with ConnectionError, none waits for ever."""
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    first, behind = await _reading(connection, "2", [True, False])
    calls = [first, *behind]
    await until(lambda: len(connection._waiting) == 3, 5, "the calls behind it sent")
    await connection.close()
    async with asyncio.timeout(1):
        results = await asyncio.gather(*calls)
    for (reply,) in results:
        assert isinstance(reply, redis.ConnectionError), reply
