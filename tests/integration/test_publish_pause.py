"""Ordering keys paused by a failed publish, on the test's server made to refuse
writes (``maxmemory`` tiny, ``noeviction`` on every master: every append fails
with OOM)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import streamsub
from streamsub._core.partition import partition_for_key
from streamsub.testing import RedisServer
from tests._layout import backend_class, command_calls, config_set, stream_key
from tests._proxy import Proxy
from tests._wait import until

KEYS = [f"key-{k}" for k in range(6)]


def _evals(admin: redis.Redis) -> int:
    return command_calls(admin).get("cmdstat_eval", 0)


def _stored(admin: redis.Redis, topic: str, partitions: int) -> dict[str, list[bytes]]:
    """Each ordering key's data as XRANGE reads it ("" for no key)."""
    stored: dict[str, list[bytes]] = {}
    for p in range(partitions):
        for _, fields in admin.xrange(stream_key(admin, topic, p)):
            stored.setdefault(fields.get(b"k", b"").decode(), []).append(fields[b"d"])
    return stored


def _late_first_writes(url: str, first_writes: set[int]) -> Any:
    """A backend whose writes linked after nothing (the first of a run of writes
    in flight to a partition) return their results late, after those behind
    them; it adds their partitions to ``first_writes``."""

    class LateFirstWrites(backend_class(url)):  # type: ignore[misc]
        async def append(self, topic, batch, links=None):  # type: ignore[no-untyped-def]
            results = await super().append(topic, batch, links)
            if links and any(link.after is None for link in links.values()):
                first_writes.update(links)
                await asyncio.sleep(0.3)  # the writes behind it come back first
            return results

    return LateFirstWrites(url)


@contextlib.contextmanager
def _out_of_memory(admin: redis.Redis) -> Iterator[None]:
    """Every append refused for want of memory, until the block ends."""
    config_set(admin, "maxmemory-policy", "noeviction")
    config_set(admin, "maxmemory", 1)
    try:
        yield
    finally:
        config_set(admin, "maxmemory", 0)


async def test_a_refused_write_pauses_its_keys_until_resumed_and_order_holds(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With the server out of memory, many publishes over six keys and keyless ones all
    fail: keyed ones with ResourceExhaustedError or, queued behind a failure,
    OrderingKeyPausedError; keyless ones only with ResourceExhaustedError. Later
    publishes of the paused keys fail fast without a command reaching Redis, keyless
    ones and a fresh key are not paused. With memory back, a paused key still fails
    until resume_publish, then publishes, and each key's stream order is exactly what
    was stored before plus what was published after."""
    admin = redis_client
    admin.flushall()
    batch = streamsub.BatchSettings(max_messages=5, max_latency=0.001)
    try:
        async with streamsub.connect(server.url, batch_settings=batch) as client:
            await client.create_topic("paused", partitions=4)
            before = [
                streamsub.OutgoingMessage(data=f"before-{i}".encode(), ordering_key=KEYS[i % 6])
                for i in range(60)
            ]
            await client.publish_many("paused", before)

            config_set(admin, "maxmemory-policy", "noeviction")
            config_set(admin, "maxmemory", 1)
            calls = [
                client.publish(
                    "paused",
                    f"during-{i}".encode(),
                    ordering_key=None if i % 4 == 0 else KEYS[i % 6],
                )
                for i in range(120)
            ]
            async with asyncio.timeout(20):
                results = await asyncio.gather(*calls, return_exceptions=True)
            paused_errors = 0
            for i, result in enumerate(results):
                if i % 4 == 0:
                    assert isinstance(result, streamsub.ResourceExhaustedError), result
                    assert not isinstance(result, streamsub.FlowControlLimitError)
                else:
                    assert isinstance(
                        result, streamsub.ResourceExhaustedError | streamsub.OrderingKeyPausedError
                    ), result
                    paused_errors += isinstance(result, streamsub.OrderingKeyPausedError)
            assert paused_errors > 0, "no publish was queued behind a failed one"

            evals = _evals(admin)
            for key in KEYS:
                with pytest.raises(streamsub.OrderingKeyPausedError) as info:
                    await client.publish("paused", b"late", ordering_key=key)
                assert info.value.topic == "paused"
                assert info.value.ordering_key == key
                message = str(info.value)
                assert f"client.resume_publish('paused', {key!r})" in message
                with pytest.raises(streamsub.OrderingKeyPausedError):  # all or nothing
                    await client.publish_many(
                        "paused",
                        [b"keyless", streamsub.OutgoingMessage(data=b"x", ordering_key=key)],
                    )
            assert _evals(admin) == evals, "a publish to a paused key reached Redis"
            with pytest.raises(streamsub.ResourceExhaustedError):  # keyless: not paused
                await client.publish("paused", b"keyless-still-oom")
            assert _evals(admin) > evals

            config_set(admin, "maxmemory", 0)
            # Memory back: keyless and a fresh key flow, the paused keys stay paused.
            await client.publish("paused", b"keyless-after")
            await client.publish("paused", b"fresh-after", ordering_key="fresh")
            with pytest.raises(streamsub.OrderingKeyPausedError):
                await client.publish("paused", b"late", ordering_key=KEYS[0])
            for key in KEYS[:3]:
                client.resume_publish("paused", key)
            client.resume_publish("paused", "never-paused")  # a no-op
            client.resume_publish("no-such-topic", key)  # a no-op
            after = [
                streamsub.OutgoingMessage(data=f"after-{i}".encode(), ordering_key=KEYS[i % 3])
                for i in range(30)
            ]
            await asyncio.gather(
                *(client.publish_many("paused", after[i : i + 5]) for i in range(0, 30, 5))
            )
            for key in KEYS[3:]:
                with pytest.raises(streamsub.OrderingKeyPausedError):
                    await client.publish("paused", b"late", ordering_key=key)

        stored = _stored(admin, "paused", 4)
        for key in KEYS:
            expected = [m.data for m in before if m.ordering_key == key]
            expected += [m.data for m in after if m.ordering_key == key]
            assert stored.get(key) == expected, f"{key}: {stored.get(key)}"
        assert stored["fresh"] == [b"fresh-after"]
        assert stored[""] == [b"keyless-after"]
    finally:
        config_set(admin, "maxmemory", 0)


async def test_a_call_waiting_for_room_fails_at_once_when_its_key_is_paused(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With PublishFlowControl full (BLOCK), a publish of key k waiting for room fails
    with OrderingKeyPausedError as soon as an earlier publish of k fails, without
    reaching Redis: after resume_publish and publishing the failed message again,
    k's stream holds only the message published again, not the waiting one first."""
    admin = redis_client
    admin.flushall()
    flow = streamsub.PublishFlowControl(message_limit=2)
    try:
        async with streamsub.connect(server.url, publish_flow_control=flow) as client:
            await client.create_topic("gated", partitions=1)
            await client.publish("gated", b"warm-up")  # the topic's publisher exists

            config_set(admin, "maxmemory-policy", "noeviction")
            config_set(admin, "maxmemory", 1)
            first = asyncio.create_task(client.publish("gated", b"k-1", ordering_key="k"))
            # Two keyless messages: they do not fit beside k-1, so they wait at the
            # head of the line and hold k-2 behind them after k-1 fails.
            others = asyncio.create_task(client.publish_many("gated", [b"other-1", b"other-2"]))
            second = asyncio.create_task(client.publish("gated", b"k-2", ordering_key="k"))
            async with asyncio.timeout(5):
                with pytest.raises(streamsub.ResourceExhaustedError):
                    await first
            await asyncio.sleep(0.01)
            assert second.done(), "a call of the paused key still waits for room"
            with pytest.raises(streamsub.OrderingKeyPausedError) as info:
                second.result()
            assert (info.value.topic, info.value.ordering_key) == ("gated", "k")
            # Let in once k-1 failed, the keyless two are written at once (no
            # write in flight: batching does not wait), to a server still full.
            async with asyncio.timeout(5):
                with pytest.raises(streamsub.ResourceExhaustedError):
                    await others

            config_set(admin, "maxmemory", 0)
            client.resume_publish("gated", "k")
            async with asyncio.timeout(5):
                await client.publish("gated", b"k-1-again", ordering_key="k")
        stored = _stored(admin, "gated", 1)
        assert stored["k"] == [b"k-1-again"]
        assert stored[""] == [b"warm-up"]
    finally:
        config_set(admin, "maxmemory", 0)


async def test_a_refused_write_answered_late_gives_its_error_to_the_writes_behind_it(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With the server out of memory, two keys on two partitions publish two
    writes each, all four in flight at once (MAX_IN_FLIGHT), each key's second
    linked after its first; each first write comes back late (as on a cluster,
    where the two can go to different nodes), after the one behind it. Every
    publish fails with the refused write's ResourceExhaustedError, not the
    link's internal BrokenLinkError, and nothing is stored."""
    admin = redis_client
    admin.flushall()
    first_writes: set[int] = set()
    keys = [next(f"late-{k}" for k in range(100) if partition_for_key(f"late-{k}", 4) == p)
            for p in (0, 1)]  # fmt: skip
    batch = streamsub.BatchSettings(max_messages=1, max_latency=0.001)
    backend = _late_first_writes(server.url, first_writes)
    async with streamsub.Client(backend, batch_settings=batch) as client:
        await client.create_topic("late", partitions=4)
        with _out_of_memory(admin):
            calls = [
                client.publish("late", f"{key}:{n}".encode(), ordering_key=key)
                for key in keys
                for n in (1, 2)
            ]
            results = await asyncio.gather(*calls, return_exceptions=True)
    assert first_writes == {0, 1}, first_writes
    for result in results:
        assert isinstance(result, streamsub.ResourceExhaustedError), repr(result)
    assert _stored(admin, "late", 4) == {}


@pytest.mark.standalone  # a TCP proxy in front of a private server
async def test_writes_in_flight_behind_a_refused_one_do_not_overtake_it(
    private_server: RedisServer, proxy: Proxy
) -> None:
    """Redis refuses a write (out of memory) while the next writes of the same
    partitions are already on their way, and memory is back before they arrive.
    None of them stores anything on a partition whose earlier write failed: each key's
    later messages fail with the earlier write's error, ResourceExhaustedError,
    instead of overtaking it; a partition with nothing refused is stored. After
    resume_publish the keys publish again in order.

    The replies are held by a proxy, so that the publisher sends on while Redis
    has already refused the first write (as with any round trip longer than a write).
    """
    admin = redis.Redis.from_url(private_server.url)
    port = await proxy.start("127.0.0.1", private_server.port)
    batch = streamsub.BatchSettings(max_messages=1000, max_latency=0.001)
    partitions = 4
    hot = [key for key in (f"hot-{k}" for k in range(200)) if partition_for_key(key, 4) == 0]
    cold = [key for key in (f"cold-{k}" for k in range(200)) if partition_for_key(key, 4) == 1]
    try:
        async with streamsub.connect(f"redis://127.0.0.1:{port}/0", batch_settings=batch) as client:
            await client.create_topic("linked", partitions=partitions)
            await client.publish_many(
                "linked",
                [streamsub.OutgoingMessage(data=b"before", ordering_key=k) for k in hot[:5]],
            )
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
            evals = _evals(admin)
            proxy.silence_replies()
            # Write 1: five keys of partition 0, refused for want of memory.
            first = asyncio.create_task(
                client.publish_many(
                    "linked",
                    [streamsub.OutgoingMessage(data=b"1", ordering_key=k) for k in hot[:5]],
                )
            )
            await until(lambda: _evals(admin) > evals, 5, "the first write's refusal")
            admin.config_set("maxmemory", 0)
            # Writes 2 to 4, sent before the publisher hears of the refusal: later
            # messages of those keys and other keys of partition 0, and partition 1's
            # keys, which nothing refused.
            later = []
            for n in (2, 3, 4):
                messages = [
                    *(
                        streamsub.OutgoingMessage(data=f"{n}".encode(), ordering_key=k)
                        for k in hot[:8]
                    ),
                    *(
                        streamsub.OutgoingMessage(data=f"{n}".encode(), ordering_key=k)
                        for k in cold[:3]
                    ),
                ]
                later.append(asyncio.create_task(client.publish_many("linked", messages)))
                # Partition 0's and partition 1's part of write n reached Redis.
                await until(lambda n=n: _evals(admin) >= evals + 2 * n - 1, 5, f"write {n}")
            proxy.resume()
            async with asyncio.timeout(10):
                results = await asyncio.gather(first, *later, return_exceptions=True)
            for result in results:
                # A call spanning a refused partition fails with the refusal.
                assert isinstance(result, streamsub.ResourceExhaustedError), result

            stored = _stored(admin, "linked", partitions)
            for key in hot[:8]:
                before = [b"before"] if key in hot[:5] else []
                assert stored.get(key, []) == before, f"{key} overtook a refused write"
            for key in cold[:3]:
                assert stored[key] == [b"2", b"3", b"4"]  # partition 1 was never refused

            for key in hot[:8]:
                with pytest.raises(streamsub.OrderingKeyPausedError):
                    await client.publish("linked", b"late", ordering_key=key)
                client.resume_publish("linked", key)
            for n in (1, 2):
                await client.publish_many(
                    "linked",
                    [
                        streamsub.OutgoingMessage(data=f"again-{n}".encode(), ordering_key=k)
                        for k in hot[:8]
                    ],
                )
        stored = _stored(admin, "linked", partitions)
        for key in hot[:8]:
            before = [b"before"] if key in hot[:5] else []
            assert stored[key] == [*before, b"again-1", b"again-2"], key
    finally:
        proxy.resume()
        admin.config_set("maxmemory", 0)
        admin.close()


@pytest.mark.standalone  # a TCP proxy in front of a private server
async def test_keyless_publishes_refused_behind_a_failed_write_are_written_again(
    private_server: RedisServer, proxy: Proxy
) -> None:
    """Redis refuses a write (out of memory) while three more writes of the same
    partition are on their way, and memory is back before they arrive: Redis
    refuses those too, as each follows a write that was not stored. Their
    messages without an ordering key (single publishes, and calls of 50) are
    written again, each once, and every such publish returns the id it was
    stored under; the keyed one fails with the refusal, as the refused write's
    own publishes do, and its caller, resuming the key as soon as it is told,
    publishes it again at once. A keyless publish cancelled by its caller
    while its write was on its way is written again too (a cancelled publish
    may be stored, as one whose write was not refused is)."""
    admin = redis.Redis.from_url(private_server.url)
    port = await proxy.start("127.0.0.1", private_server.port)
    # Fewer than 16 single publishes at a time: no write is split in halves.
    batch = streamsub.BatchSettings(max_messages=1000, max_latency=0.001)
    try:
        async with streamsub.connect(f"redis://127.0.0.1:{port}/0", batch_settings=batch) as client:

            async def keyed_then_resumed() -> str:
                with pytest.raises(streamsub.ResourceExhaustedError):
                    await client.publish("again", b"2-k", ordering_key="k")
                client.resume_publish("again", "k")
                return await client.publish("again", b"k-again", ordering_key="k")

            await client.create_topic("again", partitions=1)
            await client.publish("again", b"before")
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
            evals = _evals(admin)
            proxy.silence_replies()
            refused = [
                asyncio.create_task(client.publish("again", f"1-{i}".encode())) for i in range(3)
            ]
            await until(lambda: _evals(admin) > evals, 5, "the first write's refusal")
            admin.config_set("maxmemory", 0)
            keyless: list[asyncio.Task[Any]] = []
            for n in (2, 3, 4):
                keyless += [
                    asyncio.create_task(client.publish("again", f"{n}-{i}".encode()))
                    for i in range(2)
                ]
                keyless.append(
                    asyncio.create_task(
                        client.publish_many("again", [f"{n}-many-{i}".encode() for i in range(50)])
                    )
                )
                if n == 2:
                    keyed = asyncio.create_task(keyed_then_resumed())
                    cancelled = asyncio.create_task(client.publish("again", b"2-cancelled"))
                await until(lambda n=n: _evals(admin) >= evals + n, 5, f"write {n}")
            cancelled.cancel()
            proxy.resume()
            async with asyncio.timeout(10):
                outcomes = await asyncio.gather(*refused, return_exceptions=True)
                ids = await asyncio.gather(*keyless)
                keyed_id = await keyed
            for outcome in outcomes:
                assert isinstance(outcome, streamsub.ResourceExhaustedError), outcome
            # The four writes, the three refused behind the first written again,
            # and the keyed message published again.
            assert _evals(admin) == evals + 8
    finally:
        proxy.resume()
        admin.config_set("maxmemory", 0)
    returned = {keyed_id.split("-", 1)[1]: "k"}
    assert cancelled.cancelled()
    for n, call in zip((2, 2, 2, 3, 3, 3, 4, 4, 4), ids, strict=True):
        for message_id in [call] if isinstance(call, str) else call:
            returned[message_id.split("-", 1)[1]] = f"{n}-"
    entries = admin.xrange(stream_key(admin, "again", 0))
    admin.close()
    assert [fields[b"d"] for _, fields in entries[:1]] == [b"before"]
    stored = {entry_id.decode(): fields[b"d"].decode() for entry_id, fields in entries[1:]}
    expected = {f"{n}-{i}" for n in (2, 3, 4) for i in range(2)}
    expected |= {f"{n}-many-{i}" for n in (2, 3, 4) for i in range(50)}
    # Each once, nothing of write 1 nor the refused keyed message; the keyed
    # message published again last (its partition took writes again once the
    # writes refused behind the failure were back).
    assert sorted(stored.values()) == sorted([*expected, "2-cancelled", "k-again"])
    assert list(stored.values())[-1] == "k-again"
    assert returned.keys() == {i for i, data in stored.items() if data != "2-cancelled"}
    assert all(data.startswith(returned.get(entry_id, "2-")) for entry_id, data in stored.items())


@pytest.mark.standalone  # a TCP proxy in front of a private server
async def test_writes_behind_one_redis_acknowledged_then_lost_fail_clearly(
    private_server: RedisServer, proxy: Proxy
) -> None:
    """A write is stored, then lost with its link (its link key deleted, as a
    failover to a replica that had not received it would lose it) while the
    next two writes of its partition are on their way: Redis refuses those.
    Their keyed publishes fail with a BackendError that says so (not the link's
    internal error), their keyless ones are written again, but for those of a
    call that also holds a keyed message (it failed: none of it is stored),
    and after resume_publish the key publishes again."""
    admin = redis.Redis.from_url(private_server.url)
    port = await proxy.start("127.0.0.1", private_server.port)
    batch = streamsub.BatchSettings(max_messages=1000, max_latency=0.001)
    try:
        async with streamsub.connect(f"redis://127.0.0.1:{port}/0", batch_settings=batch) as client:
            await client.create_topic("lost", partitions=1)
            await client.publish("lost", b"before")
            stream = stream_key(admin, "lost", 0)
            evals = _evals(admin)
            proxy.silence_replies()
            first = asyncio.create_task(client.publish_many("lost", [b"1"] * 10))
            await until(lambda: _evals(admin) > evals, 5, "the first write")
            (link,) = admin.keys(f"{stream}:link:*")
            admin.delete(link)
            keyed: list[asyncio.Task[str]] = []
            keyless: list[asyncio.Task[list[str]]] = []
            for n in (2, 3):
                keyed.append(
                    asyncio.create_task(client.publish("lost", f"{n}-k".encode(), ordering_key="k"))
                )
                keyless.append(
                    asyncio.create_task(client.publish_many("lost", [f"{n}".encode()] * 20))
                )
                if n == 2:
                    mixed = asyncio.create_task(
                        client.publish_many(
                            "lost",
                            [streamsub.OutgoingMessage(data=b"m-k", ordering_key="m"), *[b"m"] * 5],
                        )
                    )
                await until(lambda n=n: _evals(admin) >= evals + n, 5, f"write {n}")
            proxy.resume()
            async with asyncio.timeout(10):
                assert len(await first) == 10
                outcomes = await asyncio.gather(*keyed, mixed, return_exceptions=True)
                assert [len(ids) for ids in await asyncio.gather(*keyless)] == [20, 20]
            for outcome in outcomes:
                assert type(outcome) is streamsub.BackendError, repr(outcome)
                assert "is not stored on Redis now" in str(outcome)
            client.resume_publish("lost", "k")
            await client.publish("lost", b"after", ordering_key="k")
    finally:
        proxy.resume()
    data = [fields[b"d"] for _, fields in admin.xrange(stream)]
    admin.close()
    assert data[:11] == [b"before"] + [b"1"] * 10
    assert sorted(data[11:-1]) == [b"2"] * 20 + [b"3"] * 20
    assert data[-1] == b"after"


async def test_keyless_publishes_behind_a_refused_write_answered_late_fail_with_its_refusal(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With the server out of memory, four calls of five keyless messages each
    are four writes to one partition in flight together (MAX_IN_FLIGHT); the
    first comes back late, after those behind it, which Redis refused as
    following a write that was not stored. Their messages are written again,
    Redis, still out of memory, refuses them, and every call fails with
    ResourceExhaustedError (neither with the link's internal error nor
    waiting): nothing is stored."""
    admin = redis_client
    admin.flushall()
    first_writes: set[int] = set()
    batch = streamsub.BatchSettings(max_messages=5, max_latency=0.001)
    backend = _late_first_writes(server.url, first_writes)
    async with streamsub.Client(backend, batch_settings=batch) as client:
        await client.create_topic("late-keyless", partitions=1)
        with _out_of_memory(admin):
            evals = _evals(admin)
            calls = [
                client.publish_many("late-keyless", [f"{n}-{i}".encode() for i in range(5)])
                for n in range(4)
            ]
            async with asyncio.timeout(10):
                results = await asyncio.gather(*calls, return_exceptions=True)
            written = _evals(admin) - evals
    assert first_writes == {0}
    for result in results:
        assert isinstance(result, streamsub.ResourceExhaustedError), repr(result)
    assert written == 4 + 3  # the three behind the first, written again
    assert _stored(admin, "late-keyless", 1) == {}


async def test_publishes_written_again_fail_rather_than_wait_when_their_answer_cannot_be_handed_out(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Two calls of five keyless messages are two writes in flight to one
    partition while the server is out of memory: the first is refused, the
    second refused behind it. Memory is back when the second's messages are
    written again, but that write's answer lacks an id (a backend bug): the
    second call fails with the publisher's unexpected-error BackendError at
    once rather than wait for ever, and the topic publishes again afterwards."""
    admin = redis_client
    admin.flushall()
    again: list[int] = []

    class ShortAnswerAgain(backend_class(server.url)):  # type: ignore[misc]
        async def append(self, topic, batch, links=None):  # type: ignore[no-untyped-def]
            if links is not None:
                return await super().append(topic, batch, links)
            config_set(admin, "maxmemory", 0)  # the write again goes through
            again.append(len(batch))
            results = await super().append(topic, batch, links)
            return {p: ids[:-1] for p, ids in results.items()}  # one id short

    batch = streamsub.BatchSettings(max_messages=5, max_latency=0.001)
    async with streamsub.Client(ShortAnswerAgain(server.url), batch_settings=batch) as client:
        await client.create_topic("short", partitions=1)
        with _out_of_memory(admin):
            calls = [
                client.publish_many("short", [f"{n}-{i}".encode() for i in range(5)])
                for n in range(2)
            ]
            async with asyncio.timeout(10):
                first, second = await asyncio.gather(*calls, return_exceptions=True)
        assert again == [1]
        assert isinstance(first, streamsub.ResourceExhaustedError), repr(first)
        assert type(second) is streamsub.BackendError, repr(second)
        assert "unexpected error" in str(second), second
        async with asyncio.timeout(10):
            assert len(await client.publish_many("short", [b"after"] * 3)) == 3
