"""The blocking facade's publish of a paused ordering key while flow control is
full. The async ``publish`` checks the pause before it waits for room; the
blocking one waits for room in the calling thread first, and is sent only once
admitted, by which time the key may have been resumed and its failed message
published again: then the waiting message is stored first."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
import redis

import streamsub
import streamsub.blocking
from streamsub._core.partition import partition_for_key
from streamsub.testing import RedisServer
from tests._layout import config_set, pause_writes, stream_key, unpause_writes


@pytest.mark.timeout(60)
def test_a_blocking_publish_of_a_paused_key_fails_fast_even_when_it_must_wait_for_room(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Key k is paused by a refused write (out of memory). With PublishFlowControl
    full (message_limit=2, two publishes of another key held by CLIENT PAUSE
    WRITE), a thread publishes k's next message: it must fail at once with
    OrderingKeyPausedError (README: "every later publish with it raises
    OrderingKeyPausedError ... at once, without touching Redis, until
    client.resume_publish"; issue 7: the blocking client has "the same settings
    and semantics as the async API"). Instead it waits for room; meanwhile the
    application resumes k and publishes the failed message again, and the
    waiting message is stored before it, breaking k's order."""
    admin = redis_client
    admin.flushall()
    flow = streamsub.PublishFlowControl(message_limit=2)
    try:
        with streamsub.blocking.connect(
            server.url, publish_flow_control=flow, trim_in_background=False
        ) as client:
            client.create_topic("orders", partitions=1)
            config_set(admin, "maxmemory-policy", "noeviction")
            config_set(admin, "maxmemory", 1)
            with pytest.raises(streamsub.ResourceExhaustedError):
                client.publish("orders", b"k:1", ordering_key="k").result(timeout=10)
            config_set(admin, "maxmemory", 0)

            pause_writes(admin, 3000)
            held = [client.publish("orders", f"x:{n}".encode(), ordering_key="x") for n in (1, 2)]
            waiting: list[Future[str] | BaseException] = []

            def publish_next() -> None:
                try:
                    waiting.append(client.publish("orders", b"k:2", ordering_key="k"))
                except BaseException as exc:
                    waiting.append(exc)

            thread = threading.Thread(target=publish_next)
            thread.start()
            # It fails at once, or it waits for room, which comes only when the 3 s
            # pause ends: half that tells them apart on a busy machine too.
            thread.join(1.5)
            fast = list(waiting)
            client.resume_publish("orders", "k")
            again = client.publish("orders", b"k:1", ordering_key="k")  # after k:2's thread
            thread.join(10)
            for future in held:
                future.result(timeout=10)
            again.result(timeout=10)
            outcome = waiting[0]
            if isinstance(outcome, Future):
                try:
                    outcome.result(timeout=10)
                except streamsub.OrderingKeyPausedError as exc:
                    outcome = exc
        assert partition_for_key("k", 1) == 0
        stored = [
            fields[b"d"]
            for _, fields in admin.xrange(stream_key(admin, "orders", 0))
            if fields[b"k"] == b"k"
        ]
    finally:
        unpause_writes(admin)
        config_set(admin, "maxmemory", 0)
    assert fast, (
        f"publishing a paused key waited for room instead of failing at once; it ended "
        f"{outcome!r} and k's stored order is {stored}"
    )
    assert isinstance(outcome, streamsub.OrderingKeyPausedError), outcome
    assert stored == [b"k:1"], f"k's stored order: {stored}"
