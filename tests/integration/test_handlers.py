"""Handlers written the way users write them: each runs in a task of its own.

``asyncio.timeout``, httpx (anyio cancel scopes inside), a plain ``def``, a
``lambda`` over an ``async def``, a decorator that returns a plain function:
each must see exactly what it would see in any other task or thread, and every
message must end acked.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

import streamsub
from streamsub import Message, RetryPolicy
from tests._wait import until

FAST_RETRY = RetryPolicy(minimum_backoff=0.1, maximum_backoff=0.1)


@pytest.fixture
async def http_url() -> AsyncIterator[str]:
    """A tiny HTTP/1.1 server on loopback that answers every request with 200 ok."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/"


async def test_handlers_under_asyncio_timeout_and_httpx_all_ack_each_alone_in_its_task(
    client: streamsub.Client, http_url: str
) -> None:
    """300 messages over 4 partitions, every tenth handler timing out once inside
    ``asyncio.timeout``, each calling a local HTTP server through httpx with a
    timeout: all 300 are acked, handlers run concurrently, no handler ever ran
    in a task while another handler was running in it (a runner task runs
    handlers one after another), and each started uncancelled in a context of
    its own, those that ran where a handler had just timed out too."""
    await client.create_topic("web", partitions=4)
    await client.create_subscription("web-sub", topic="web", retry_policy=FAST_RETRY)
    await client.publish_many(
        "web",
        [streamsub.OutgoingMessage(data=str(i).encode(), ordering_key=f"k{i}") for i in range(300)],
    )
    done: set[int] = set()
    busy: set[asyncio.Task[object]] = set()
    shared = 0
    most = 0
    timeouts = 0
    after_a_timeout = 0
    timed_out_in: set[asyncio.Task[object]] = set()
    unclean: list[str] = []
    mine: contextvars.ContextVar[int] = contextvars.ContextVar("mine")

    async with httpx.AsyncClient(timeout=5.0) as http:

        async def handler(message: Message) -> None:
            nonlocal timeouts, shared, most, after_a_timeout
            task = asyncio.current_task()
            assert task is not None
            shared += task in busy
            busy.add(task)
            most = max(most, len(busy))
            if task in timed_out_in:  # the task's last handler timed out
                after_a_timeout += 1
                timed_out_in.discard(task)
            if task.cancelling() or mine.get(None) is not None:
                unclean.append(f"{message.data!r}: {task.cancelling()}, {mine.get(None)}")
            n = int(message.data)
            mine.set(n)
            try:
                async with asyncio.timeout(1.5):
                    if n % 10 == 0 and message.delivery_attempt == 1:
                        await asyncio.sleep(5)
                    response = await http.get(http_url, timeout=2.0)
            except TimeoutError:
                timeouts += 1
                timed_out_in.add(task)
                raise
            finally:
                busy.discard(task)
            assert response.text == "ok"
            done.add(n)

        flow = streamsub.FlowControl(max_messages=50)  # within httpx's 100 connections
        async with client.subscribe("web-sub", handler, flow_control=flow) as sub:
            await until(lambda: sub.statistics().acked == 300, 30, "all 300 acked")
            assert sub.statistics().handler_errors == 30
    assert done == set(range(300))
    assert timeouts == 30
    assert shared == 0, "a handler ran in a task while another handler was running in it"
    assert most >= 20, f"at most {most} handlers ran at once (flow control allows 50)"
    assert unclean == [], "a handler started cancelled or with another's context"
    assert after_a_timeout > 0, "no handler ran where one had timed out: nothing was shared"


async def test_a_task_group_and_context_variables_bind_to_the_handlers_task(
    client: streamsub.Client,
) -> None:
    """A TaskGroup inside a handler and a context variable it sets belong to that
    handler alone: 100 concurrent handlers never see each other's value."""
    await client.create_topic("ctx", partitions=4)
    await client.create_subscription("ctx-sub", topic="ctx")
    await client.publish_many("ctx", [str(i).encode() for i in range(100)])
    current: contextvars.ContextVar[bytes] = contextvars.ContextVar("current")
    mixed: list[bytes] = []
    handled: list[bytes] = []

    async def check() -> None:
        await asyncio.sleep(0.01)

    async def handler(message: Message) -> None:
        current.set(message.data)
        async with asyncio.TaskGroup() as group:
            group.create_task(check())
            group.create_task(check())
        await asyncio.sleep(0.01)
        if current.get() != message.data:
            mixed.append(message.data)
        handled.append(message.data)

    async with client.subscribe("ctx-sub", handler) as sub:
        await until(lambda: sub.statistics().acked == 100, 10, "all 100 acked")
    assert mixed == []
    assert sorted(handled, key=int) == [str(i).encode() for i in range(100)]


async def test_an_async_function_behind_a_lambda_or_a_plain_decorator_is_awaited(
    client: streamsub.Client,
) -> None:
    """``lambda m: work(m)`` and a decorator returning a plain function give back
    a coroutine: it is awaited, so its work is done and its failure nacks."""
    await client.create_topic("wrapped", partitions=3)
    await client.create_subscription("wrapped-sub", topic="wrapped", retry_policy=FAST_RETRY)
    finished: list[tuple[str, bytes, int]] = []

    async def work(kind: str, message: Message) -> None:
        await asyncio.sleep(0.01)
        if message.data.endswith(b"7") and message.delivery_attempt == 1:
            raise RuntimeError("fails once")
        finished.append((kind, message.data, message.delivery_attempt))

    def logged(function: Callable[[Message], Awaitable[None]]) -> Callable[[Message], object]:
        @functools.wraps(function)
        def plain(message: Message) -> object:  # returns the coroutine, not awaited
            return function(message)

        return plain

    async def decorated_work(message: Message) -> None:
        await work("decorated", message)

    for kind, handler in (
        ("lambda", lambda m: work("lambda", m)),
        ("decorated", logged(decorated_work)),
    ):
        topic_messages = [f"{kind}-{i}".encode() for i in range(20)]
        await client.publish_many("wrapped", topic_messages)
        async with client.subscribe("wrapped-sub", handler) as sub:
            await until(lambda: sub.statistics().acked == 20, 10, f"20 acked via {kind}")
        mine = sorted((data, attempt) for k, data, attempt in finished if k == kind)
        assert [data for data, _ in mine] == sorted(topic_messages)
        assert dict(mine)[f"{kind}-7".encode()] == 2
        assert dict(mine)[f"{kind}-17".encode()] == 2


async def test_plain_def_handlers_settle_with_plain_calls_from_their_threads(
    client: streamsub.Client,
) -> None:
    """In manual mode a plain ``def`` handler calls ``message.ack()`` and
    ``message.nack()`` from its pool thread: 60 messages all end acked, the
    nacked half on attempt 2."""
    await client.create_topic("threads", partitions=3)
    await client.create_subscription("threads-sub", topic="threads", retry_policy=FAST_RETRY)
    await client.publish_many("threads", [str(i).encode() for i in range(60)])
    acked: dict[int, int] = {}
    threads: set[str] = set()
    lock = threading.Lock()

    def handler(message: Message) -> None:
        threads.add(threading.current_thread().name)
        n = int(message.data)
        if n % 2 and message.delivery_attempt == 1:
            message.nack()
            return
        with lock:
            acked[n] = message.delivery_attempt
        message.ack()

    async with client.subscribe("threads-sub", handler, ack_mode="manual") as sub:
        await until(lambda: sub.statistics().acked == 60, 10, "60 acked")
    assert sorted(acked) == list(range(60))
    assert {n: a for n, a in acked.items() if n % 2} == dict.fromkeys(range(1, 60, 2), 2)
    assert all(name.startswith("streamsub-handler") for name in threads)


async def test_async_handlers_settle_without_await(client: streamsub.Client) -> None:
    """``message.ack()`` without ``await`` in an async handler settles (as in
    Pub/Sub's clients); ``await message.ack()`` still works too."""
    await client.create_topic("noawait", partitions=2)
    await client.create_subscription("noawait-sub", topic="noawait")
    await client.publish_many("noawait", [str(i).encode() for i in range(40)])

    async def handler(message: Message) -> None:
        if int(message.data) % 2:
            message.ack()
        else:
            await message.ack()

    async with client.subscribe("noawait-sub", handler, ack_mode="manual") as sub:
        await until(lambda: sub.statistics().acked == 40, 10, "40 acked")
    stats = await client.subscription_stats("noawait-sub")
    assert stats.pending == 0


async def test_the_thread_pool_size_is_a_setting(client: streamsub.Client) -> None:
    """``handler_threads=20`` runs 20 plain handlers at once: all meet at a barrier
    that a pool of 10 could never fill."""
    await client.create_topic("pool", partitions=2)
    await client.create_subscription("pool-sub", topic="pool")
    await client.publish_many("pool", [str(i).encode() for i in range(20)])
    barrier = threading.Barrier(20, timeout=5)

    def handler(message: Message) -> None:
        barrier.wait()

    async with client.subscribe("pool-sub", handler, handler_threads=20) as sub:
        await until(lambda: sub.statistics().acked == 20, 8, "20 handlers past the barrier")
    assert sub.statistics().handler_errors == 0
