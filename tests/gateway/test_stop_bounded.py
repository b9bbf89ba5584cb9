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

from streamsub._backends.base import LeaseMode, Ownership, TopicRecord
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


class _DropsCancelInLeave(TEST_BACKEND):
    """Once armed, its next ``own_partitions`` that leaves an ordered subscription's
    ownership (the housekeeping's, here) holds on after Redis answered, and a
    cancellation that lands there is dropped, as redis-py's send does on 3.11."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed = False
        self.holding = False
        self.dropped = 0

    async def own_partitions(
        self,
        topic: TopicRecord,
        group: str,
        member: str,
        lease_ms: int,
        *,
        release: Sequence[int] = (),
        leave: bool = False,
        take: bool = True,
        instance: str = "",
        claim: bool = False,
    ) -> Ownership:
        owned = await super().own_partitions(
            topic,
            group,
            member,
            lease_ms,
            release=release,
            leave=leave,
            take=take,
            instance=instance,
            claim=claim,
        )
        if leave and self.armed:
            self.armed = False
            self.holding = True
            try:
                await asyncio.sleep(3600)  # until the stop cancels the housekeeping
            except asyncio.CancelledError:
                self.dropped += 1
        return owned


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


async def _stop_within_bound(gateway: Gateway) -> None:
    """Stop ``gateway``; fail if that takes more than STOP_BOUND (then cancel it,
    which ends what hung with it)."""
    stopping = asyncio.ensure_future(gateway.stop())
    done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND)
    if not done:
        stopping.cancel()
        await asyncio.wait({stopping}, timeout=STOP_BOUND)
    assert done, f"stop() did not return within {STOP_BOUND} s"
    stopping.result()


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
    stopped = False
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
        stopped = True
        await _stop_within_bound(leaving)  # never returned before
        assert backend.dropped == 1
        async with grpc.aio.insecure_channel(f"127.0.0.1:{other.grpc_port}") as channel:
            # Given back, not lapsed: a lapse would take the 60 s ack deadline.
            again = await _pull_all(_Api(channel), subscription, ids, 30)
        assert again - started < 30
    finally:
        if not stopped:
            await leaving.stop()
        await other.stop()


async def test_stop_returns_when_a_redis_call_dropped_the_housekeepings_cancellation(
    server: RedisServer, project: str
) -> None:
    """A gateway whose only stream of an ordered subscription (50 messages, 5 keys,
    16 partitions) got every message, acked them and closed leaves the
    subscription's ownership 2 s later from its housekeeping loop; stopped while
    that Redis call drops the cancellation, stop returns within seconds."""
    backend = _DropsCancelInLeave(server.url)
    gateway = Gateway(backend=backend, grpc_address="127.0.0.1:0", http_address=None)
    await gateway.start()
    topic = f"projects/{project}/topics/orders"
    subscription = f"projects/{project}/subscriptions/billing"
    stopped = False
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
            api = _Api(channel)
            await api("CreateTopic", pb.Topic(name=topic))
            await api(
                "CreateSubscription",
                pb.Subscription(
                    name=subscription,
                    topic=topic,
                    ack_deadline_seconds=60,
                    enable_message_ordering=True,
                ),
            )
            messages = [
                pb.PubsubMessage(data=b"m%d" % i, ordering_key=f"key-{i % 5}")
                for i in range(MESSAGES)
            ]
            published = await api("Publish", pb.PublishRequest(topic=topic, messages=messages))
            ids = set(published.message_ids)
            open_stream = channel.stream_stream(
                "/google.pubsub.v1.Subscriber/StreamingPull",
                request_serializer=pb.StreamingPullRequest.SerializeToString,
                response_deserializer=pb.StreamingPullResponse.FromString,
            )
            call = open_stream()
            await call.write(
                pb.StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=60)
            )
            got: dict[str, str] = {}
            while set(got) != ids:
                response = await asyncio.wait_for(call.read(), 30)
                assert response is not grpc.aio.EOF, "the stream ended early"
                got.update((m.message.message_id, m.ack_id) for m in response.received_messages)
            backend.armed = True
            await call.write(pb.StreamingPullRequest(ack_ids=list(got.values())))
            await call.done_writing()  # the client closes its stream: OK
            while await asyncio.wait_for(call.read(), 30) is not grpc.aio.EOF:
                pass
            assert await call.code() == grpc.StatusCode.OK
        await until(lambda: backend.holding, 30, "the housekeeping leaving the ownership")
        stopped = True
        await _stop_within_bound(gateway)  # never returned before
        assert backend.dropped == 1
    finally:
        if not stopped:
            await gateway.stop()


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
