"""A gateway's stop returns within seconds even when a Redis call swallowed the
cancellation of one of its background tasks.

On Python 3.11 redis-py sends each command under ``asyncio.wait_for``, which
hands back a send that finished as the cancellation came and drops the
cancellation. A lease table's loop whose cancellation was dropped so ran on for
ever, and ``Gateway.stop()``, which awaited it, never returned (CI saw the
session gateway's teardown time out). The backend here is a real RedisBackend
on the test server with one method wrapped to drop the cancellation at the
point where redis-py can: Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import pytest

from streamsub._backends.base import LeaseMode, TopicRecord
from streamsub.gateway import Gateway
from streamsub.gateway._proto import METHODS, pb
from streamsub.gateway._tasks import end_task
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND
from tests._wait import until

pytestmark = pytest.mark.timeout(120)

MESSAGES = 50
STOP_BOUND = 10.0
"""A stop here takes well under a second; the hang it guards against is for ever."""


class _DropsCancelInLease(TEST_BACKEND):
    """Once armed, its next ``lease_deliveries`` (only a lease table's loop calls it
    here) holds on after Redis answered, and a cancellation that lands there
    is dropped and the answer returned, as redis-py's send does on Python 3.11."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed = False
        self.holding = False
        self.dropped = 0

    async def lease_deliveries(
        self,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[tuple[str, str, int, int, LeaseMode]]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        leased = await super().lease_deliveries(topic, group, items, min_idle_ms)
        if self.armed:
            self.armed = False
            self.holding = True
            try:
                await asyncio.sleep(3600)  # until the stop cancels the lease table
            except asyncio.CancelledError:
                self.dropped += 1
        return leased


class _Api:
    """Unary google.pubsub.v1 calls on one gRPC channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    async def __call__(self, method: str, request: Any) -> Any:
        service = next(s for s, methods in METHODS.items() if method in methods)
        _, response = METHODS[service][method]
        call = self._channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        return await call(request, timeout=30)


async def _pull_all(api: _Api, subscription: str, wanted: set[str], timeout: float) -> float:
    """Pull until every message of ``wanted`` came; return when the last did (monotonic)."""
    got: set[str] = set()
    deadline = time.monotonic() + timeout
    while got != wanted:
        assert time.monotonic() < deadline, f"{len(wanted - got)} messages never came"
        response = await api(
            "Pull", pb.PullRequest(subscription=subscription, max_messages=MESSAGES)
        )
        got.update(m.message.message_id for m in response.received_messages)
    return time.monotonic()


async def test_stop_returns_when_a_redis_call_dropped_a_lease_tables_cancellation(
    server: RedisServer, project: str
) -> None:
    """A gateway holding leases of 50 messages on 16 partitions stops while its
    lease table's loop is inside a Redis call that drops the cancellation: stop
    returns within seconds (not never), and the leases (ack deadline 60 s) are
    still given back, so another gateway delivers every message at once."""
    backend = _DropsCancelInLease(server.url)
    leaving = Gateway(backend=backend, grpc_address="127.0.0.1:0", http_address=None)
    other = Gateway(server.url, grpc_address="127.0.0.1:0", http_address=None)
    await leaving.start()
    await other.start()
    topic = f"projects/{project}/topics/orders"
    subscription = f"projects/{project}/subscriptions/billing"
    stopping: asyncio.Future[None] | None = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{leaving.grpc_port}") as channel:
            api = _Api(channel)
            await api("CreateTopic", pb.Topic(name=topic))
            await api(
                "CreateSubscription",
                pb.Subscription(name=subscription, topic=topic, ack_deadline_seconds=60),
            )
            published = await api(
                "Publish",
                pb.PublishRequest(
                    topic=topic,
                    messages=[pb.PubsubMessage(data=b"m%d" % i) for i in range(MESSAGES)],
                ),
            )
            ids = set(published.message_ids)
            assert len(ids) == MESSAGES
            backend.armed = True
            await _pull_all(api, subscription, ids, 30)
        # The lease table's first round (2 s on) ends the leases at their deadline.
        await until(lambda: backend.holding, 30, "the lease table inside a lease call")
        started = time.monotonic()
        stopping = asyncio.ensure_future(leaving.stop())
        done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND)
        assert done, f"stop() did not return within {STOP_BOUND} s"
        stopping.result()
        assert backend.dropped == 1
        async with grpc.aio.insecure_channel(f"127.0.0.1:{other.grpc_port}") as channel:
            # Given back, not lapsed: a lapse would take the 60 s ack deadline.
            again = await _pull_all(_Api(channel), subscription, ids, 30)
        assert again - started < 30
    finally:
        if stopping is None:
            await leaving.stop()
        elif not stopping.done():
            stopping.cancel()  # ends the hung lease table with it
            await asyncio.wait({stopping}, timeout=STOP_BOUND)
        await other.stop()


async def test_end_task_cancels_again_a_task_that_dropped_its_cancellation() -> None:
    """A task that drops its cancellation and goes on to wait for ever is cancelled
    again, and ends within a fraction of a second."""
    dropped = asyncio.Event()

    async def drops_once() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            dropped.set()
        await asyncio.sleep(3600)

    task = asyncio.get_running_loop().create_task(drops_once())
    await asyncio.sleep(0)
    started = time.monotonic()
    await end_task(task, "a task that drops one cancellation", timeout=STOP_BOUND)
    assert dropped.is_set()
    assert task.cancelled()
    assert time.monotonic() - started < 1.0


async def test_end_task_gives_up_on_a_task_that_never_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task that drops every cancellation is left behind after the bound, with an
    error logged that names it: its owner goes on closing."""
    release = asyncio.Event()

    async def never_ends() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    task = asyncio.get_running_loop().create_task(never_ends())
    await asyncio.sleep(0)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="streamsub.gateway"):
        await end_task(task, "a stubborn task", timeout=0.5)
    took = time.monotonic() - started
    assert 0.5 <= took < 2.0
    assert not task.done()
    assert "a stubborn task did not end within 0.5 s" in caplog.text
    release.set()
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.done()
