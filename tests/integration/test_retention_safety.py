"""Retention after seeks, with far-off ids and clocks, and when a pass fails or
meets dead letters: nothing a subscription will read again goes, nothing is
dropped silently."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import AsyncIterator

import pytest
import redis

import streamsub
from streamsub import metrics
from streamsub._engine.trimmer import Trimmer, enforce_retention
from streamsub._errors import UnavailableError
from streamsub.testing import RedisServer
from tests._layout import backend_class, stream_key

PARTITIONS = 4
PER_PARTITION = 500


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A client on an emptied server that trims only when a test asks it to."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as connected:
        yield connected


async def _fill(client: streamsub.Client, topic: str) -> list[str]:
    """Publish PER_PARTITION messages to each of the PARTITIONS partitions."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < PARTITIONS:
        keys.setdefault(streamsub.fnv1a_32(f"k{i}".encode()) % PARTITIONS, f"k{i}")
        i += 1
    return await client.publish_many(
        topic,
        [
            streamsub.OutgoingMessage(data=str(n).encode(), ordering_key=keys[p])
            for n in range(PER_PARTITION)
            for p in range(PARTITIONS)
        ],
    )


def _ids(redis_client: redis.Redis, topic: str) -> dict[int, list[bytes]]:
    return {
        p: [e[0] for e in redis_client.xrange(stream_key(redis_client, topic, p))]
        for p in range(PARTITIONS)
    }


async def test_trim_keeps_what_a_group_sought_back_reads_again(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """After a seek to "earliest" a group with the newer half pending reads the
    older half again: retention keeps all of it, and the group gets all again."""
    await client.create_topic(
        "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=10)
    )
    await client.create_subscription("billing", topic="orders", start="earliest")
    await _fill(client, "orders")
    before = _ids(redis_client, "orders")
    for p in range(PARTITIONS):
        got = redis_client.xreadgroup(
            "billing", "c", {stream_key(redis_client, "orders", p): ">"}, count=10_000
        )
        entries = got[0][1]
        redis_client.xack(
            stream_key(redis_client, "orders", p), "billing", *[e[0] for e in entries[:250]]
        )
    await client.seek("billing", to="earliest")
    result = await client.enforce_retention("orders")
    assert result.trimmed == 0
    assert _ids(redis_client, "orders") == before
    for p in range(PARTITIONS):
        again = redis_client.xreadgroup(
            "billing", "c", {stream_key(redis_client, "orders", p): ">"}, count=10_000
        )
        assert [e[0] for e in again[0][1]] == before[p]


async def test_trim_after_a_seek_to_a_time_or_a_message(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A seek to a time or message id leaves the group at "<ms>-18446744073709551615";
    retention still works and trims exactly below where the group reads next."""
    await client.create_topic(
        "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=10)
    )
    await client.create_subscription("billing", topic="orders", start="earliest")
    ids = await _fill(client, "orders")
    before = _ids(redis_client, "orders")
    # In stream order: by millisecond, then sequence (the writes span milliseconds).
    target = sorted(
        (m for m in ids if m.startswith("2-")), key=lambda m: tuple(map(int, m.split("-")[1:]))
    )
    middle = target[len(target) // 2]
    await client.seek("billing", to=middle)
    groups = redis_client.xinfo_groups(stream_key(redis_client, "orders", 0))
    assert groups[0]["last-delivered-id"].decode().endswith("-18446744073709551615")
    ms = int(middle.split("-")[1])
    result = await client.enforce_retention("orders")
    assert result.dropped_unacked == 0
    kept = _ids(redis_client, "orders")
    assert kept[2][0] == middle.split("-", 1)[1].encode()
    for p in (0, 1, 3):  # kept from the message's millisecond on
        assert int(kept[p][0].split(b"-")[0]) >= ms or len(kept[p]) == 10
        assert all(e in kept[p] for e in before[p] if int(e.split(b"-")[0]) >= ms)
    future = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    await client.seek("billing", to=future)
    result = await client.enforce_retention("orders")
    assert [len(v) for v in _ids(redis_client, "orders").values()] == [10] * PARTITIONS


async def test_ids_beyond_double_precision_compare_exactly(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Ids whose milliseconds exceed 2^53 (a producer's own ids) are compared as
    text: the group that is behind by a few sequence numbers keeps them."""
    await client.create_topic("odd", partitions=1, retention=streamsub.Retention(max_length=1))
    await client.create_subscription("ahead", topic="odd", start="earliest")
    await client.create_subscription("behind", topic="odd", start="earliest")
    key = stream_key(redis_client, "odd", 0)
    for seq in range(1, 11):
        redis_client.xadd(key, {"x": "1"}, id=f"9007199254740992-{seq}")
    redis_client.xadd(key, {"x": "1"}, id="9007199254740993-0")
    redis_client.xgroup_setid(key, "ahead", "9007199254740993-0")
    redis_client.xgroup_setid(key, "behind", "9007199254740992-5")
    result = await client.enforce_retention("odd")
    assert result.trimmed == 5
    assert redis_client.xrange(key)[0][0] == b"9007199254740992-6"


async def test_max_age_is_judged_by_the_server_clock(
    client: streamsub.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose clock runs 90 s ahead does not trim messages a second old
    under max_age=60 s, even with drop_unacked."""
    import streamsub._client as client_module

    class Ahead:
        @staticmethod
        def time() -> float:
            return time.time() + 90

    await client.create_topic(
        "events",
        partitions=PARTITIONS,
        retention=streamsub.Retention(max_age=60, drop_unacked=True),
    )
    await client.create_subscription("reader", topic="events", start="earliest")
    await _fill(client, "events")
    monkeypatch.setattr(client_module, "time", Ahead)
    result = await client.enforce_retention("events")
    assert (result.trimmed, result.dropped_unacked) == (0, 0)


async def test_drops_are_reported_when_a_pass_fails_partway(
    client: streamsub.Client,
    redis_client: redis.Redis,
    server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a pass dropped before a step failed reaches the metric and the log,
    exactly as counted in Redis."""
    metrics.reset()
    await client.create_topic(
        "orders",
        partitions=PARTITIONS,
        retention=streamsub.Retention(max_length=10, drop_unacked=True),
    )
    await client.create_subscription("billing", topic="orders", start="earliest")
    await _fill(client, "orders")
    backend = backend_class(server.url)(server.url)
    real = backend.trim

    async def fails_on_the_last_partition(topic, partition, **kw):  # type: ignore[no-untyped-def]
        if partition == PARTITIONS - 1:
            raise UnavailableError("connection reset (simulated)")
        return await real(topic, partition, **kw)

    backend.trim = fails_on_the_last_partition  # type: ignore[method-assign]
    topic = await backend.get_topic("orders")
    assert topic is not None
    caplog.set_level(logging.WARNING, logger="streamsub")
    try:
        with pytest.raises(UnavailableError):
            await enforce_retention(backend, topic, now=time.time(), batch=100)
    finally:
        await backend.close()
    in_redis = sum(
        int(redis_client.get(f"{stream_key(redis_client, 'orders', p)}:dropped") or 0)
        for p in range(PARTITIONS)
    )
    assert in_redis == (PARTITIONS - 1) * (PER_PARTITION - 10)
    assert metrics.snapshot()["dropped_unacked"].get("orders") == in_redis
    assert any(f"dropped {in_redis} unacknowledged" in r.getMessage() for r in caplog.records)


async def test_retention_of_dead_letters_is_counted_and_logged(
    client: streamsub.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention deletes unresolved dead letters of a dead-letter topic nobody
    reads only with a count (dropped_unacked, the metric) and a warning."""
    metrics.reset()
    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_topic("dead", partitions=2, retention=streamsub.Retention(max_length=5))
    await client.create_subscription(
        "billing", topic="orders", dead_letter_topic="dead", max_delivery_attempts=1
    )
    await _fill(client, "orders")
    total = PARTITIONS * PER_PARTITION

    async def refuse(m: streamsub.Message) -> None:
        m.dead_letter("bad")

    async with client.subscribe("billing", refuse, ack_mode="manual") as sub:
        deadline = time.monotonic() + 60
        while sub.statistics().dead_lettered < total:
            assert time.monotonic() < deadline, "dead letters never all written"
            await __import__("asyncio").sleep(0.05)
    caplog.set_level(logging.WARNING, logger="streamsub")
    result = await client.enforce_retention("dead")
    assert result.trimmed == total - 10
    assert result.dropped_unacked == result.trimmed
    stats = await client.stats("dead")
    assert stats.topics[0].dropped_unacked == result.trimmed
    assert metrics.snapshot()["dropped_unacked"].get("dead") == result.trimmed
    assert any(
        f"deleted {result.trimmed} unresolved dead letters" in r.getMessage()
        for r in caplog.records
    )


async def test_a_long_pass_renews_its_lock_and_stops_when_it_lost_it(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """The trimmer's lock is extended (compare-and-extend) between steps; a pass
    whose lock was taken over stops after the step that noticed it."""
    await client.create_topic(
        "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=10)
    )
    await _fill(client, "orders")
    backend = backend_class(server.url)(server.url)
    try:
        assert await backend.try_lock("retention:orders", "mine", 0.2)
        assert await backend.extend_lock("retention:orders", "mine", 30)
        assert redis_client.pttl("ss:lock:retention:orders") > 20_000
        assert not await backend.extend_lock("retention:orders", "theirs", 30)
        redis_client.set("ss:lock:retention:orders", "theirs")
        topic = await backend.get_topic("orders")
        assert topic is not None
        steps = 0

        async def renew() -> bool:
            nonlocal steps
            steps += 1
            return await backend.extend_lock("retention:orders", "mine", 30)

        result = await enforce_retention(backend, topic, now=time.time(), batch=100, renew=renew)
    finally:
        await backend.close()
    assert (steps, result.trimmed) == (1, 100)
    assert redis_client.get("ss:lock:retention:orders") == b"theirs"


async def test_a_snapshot_taken_during_a_pass_holds_back_its_trim(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """A snapshot taken after a pass read the snapshot list, followed by its
    subscription acknowledging everything, still keeps every message the
    snapshot needs: its hold is written with the positions and read by the trim
    step; deleting the snapshot releases it."""
    await client.create_topic(
        "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=10)
    )
    await client.create_subscription("billing", topic="orders", start="earliest")
    await _fill(client, "orders")
    before = _ids(redis_client, "orders")
    for p in range(PARTITIONS):  # half pending, half not yet delivered
        redis_client.xreadgroup(
            "billing", "c", {stream_key(redis_client, "orders", p): ">"}, count=250
        )

    backend = backend_class(server.url)(server.url)
    trimmer = Trimmer(backend, interval=3600)
    trimmer._topics.add("orders")  # what watch_topic records, without a loop
    real_lock = backend.try_lock

    async def lock_then_race(name: str, token: str, ttl: float) -> bool:
        taken = await real_lock(name, token, ttl)
        await client.create_snapshot("snap", "billing")  # after the list was read
        for p in range(PARTITIONS):
            key = stream_key(redis_client, "orders", p)
            redis_client.xreadgroup("billing", "c", {key: ">"}, count=10_000)
            redis_client.xack(key, "billing", *before[p])
        return taken

    backend.try_lock = lock_then_race  # type: ignore[method-assign]
    try:
        results = await trimmer.run_once()
    finally:
        await backend.close()
    assert results["orders"].trimmed == 0
    assert _ids(redis_client, "orders") == before
    await client.delete_snapshot("snap")
    result = await client.enforce_retention("orders")
    assert result.trimmed == PARTITIONS * (PER_PARTITION - 10)


async def test_one_trim_step_deletes_at_most_its_batch_on_every_path(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """A trim step deletes at most `batch` entries also where the server decides
    with XTRIM … ACKED (Redis 8.2+); a pass repeats steps until done."""
    await client.create_topic(
        "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=10)
    )
    await client.create_subscription("billing", topic="orders", start="earliest")
    await _fill(client, "orders")
    for p in range(PARTITIONS):
        key = stream_key(redis_client, "orders", p)
        got = redis_client.xreadgroup("billing", "c", {key: ">"}, count=10_000)
        redis_client.xack(key, "billing", *[e[0] for e in got[0][1]])
    backend = backend_class(server.url)(server.url)
    try:
        topic = await backend.get_topic("orders")
        assert topic is not None
        acked_trim = (await backend.server_info()).acked_trim
        steps = []
        more = True
        while more:
            deleted, _, more = await backend.trim(
                topic, 0, max_age=None, max_length=10, drop_unacked=False, batch=100,
                acked_trim=acked_trim,
            )  # fmt: skip
            steps.append(deleted)
        result = await enforce_retention(backend, topic, now=time.time(), batch=100)
    finally:
        await backend.close()
    assert max(steps) <= 100
    assert sum(steps) == PER_PARTITION - 10
    assert result.trimmed == (PARTITIONS - 1) * (PER_PARTITION - 10)
