"""Connection settings: timeouts that blocking reads never hit, health checks of the
publishing connection, and the options connect() takes."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import streamsub
from streamsub._backends.base import TopicRecord
from streamsub._backends.redis._backend import MAX_READ_BLOCK, SOCKET_TIMEOUT
from streamsub._backends.redis._in_order import InOrderConnection, NotReady, take_connection
from streamsub._core.codec import pack_data
from streamsub.testing import RedisClusterServers, RedisServer
from tests._layout import backend_class, stream_key, stream_keys
from tests._proxy import Proxy
from tests._wait import until


@pytest.mark.slow
async def test_a_blocking_read_of_the_longest_block_stays_under_the_socket_timeout(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """An XREADGROUP that blocks MAX_READ_BLOCK (5 s) on an empty stream returns
    nothing, without a timeout error, under the default socket timeout."""
    assert MAX_READ_BLOCK * 2 <= SOCKET_TIMEOUT
    redis_client.flushall()
    backend = backend_class(server.url)(server.url)
    try:
        topic = await backend.create_topic(TopicRecord("blocking", 1, "", time.time()))
        redis_client.xgroup_create(stream_key(redis_client, "blocking", 0), "readers", id="$")
        started = time.monotonic()
        entries = await backend.read(
            topic, "readers", "reader-1", [0], 10, int(MAX_READ_BLOCK * 1000)
        )
        assert entries == []
        assert time.monotonic() - started >= MAX_READ_BLOCK - 0.1
    finally:
        await backend.close()


@pytest.mark.standalone  # a TCP proxy in front of the one server
@pytest.mark.parametrize(("interval", "survives"), [(0.0, True), (3600.0, False)])
async def test_a_publishing_connection_reset_while_idle_is_replaced_before_use(
    server: RedisServer, proxy: Proxy, interval: float, survives: bool
) -> None:
    """The publishing connection, idle past its health-check interval, is PINGed
    before use; one reset meanwhile is found and replaced, so the call succeeds
    (without the check, the call in its way fails)."""
    port = await proxy.start("127.0.0.1", server.port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=interval)
    try:
        assert await connection.call_many([("PING",)]) == [b"PONG"]
        proxy.reset()
        reply: object
        try:
            (reply,) = await connection.call_many([("PING",)])
        except redis.ConnectionError as exc:  # the write found the reset
            reply = exc
        assert (reply == b"PONG") == survives, reply
        assert await connection.call_many([("PING",)]) == [b"PONG"]
    finally:
        await connection.close()
        await client.aclose()


@pytest.mark.standalone  # a TCP proxy in front of the one server
async def test_a_send_that_may_not_connect_sends_nothing_until_made_ready(
    server: RedisServer, proxy: Proxy
) -> None:
    """``send_many(connect=False)`` (the cluster appender's, under its routing
    lock) raises NotReady and sends nothing where it would connect, PING an
    idle connection, or wait for a ``ready()`` that is PINGing a silent one
    (holding the connection's own lock): it returns at once, and the routing
    lock is not held for a silent server."""
    port = await proxy.start("127.0.0.1", server.port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=1.0)
    connection = InOrderConnection(client, timeout=1.0, health_check_interval=3600.0)
    count = [("INCR", "in-order-sends")]
    try:
        with pytest.raises(NotReady):  # not connected yet
            await connection.send_many(count, connect=False)
        await connection.ready()
        (first,) = await connection.send_many(count, connect=False)
        assert await first == 1
        connection._health_check_interval = 0.0  # idle at once: a send PINGs first
        proxy.drop()  # that connection is silent from now on
        with pytest.raises(NotReady):
            await connection.send_many(count, connect=False)
        pinging = asyncio.ensure_future(connection.ready())
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(NotReady):
            await connection.send_many(count, connect=False)
        assert time.monotonic() - started < 0.5, "it waited for the PING"
        with pytest.raises(redis.TimeoutError):
            await pinging
        connection._health_check_interval = 3600.0
        await connection.ready()  # a new connection: the proxy forwards new ones
        (second,) = await connection.send_many(count, connect=False)
        assert await second == 2  # the refused sends sent nothing
    finally:
        await connection.close()
        await client.aclose()


def test_socket_timeout_must_be_positive_seconds() -> None:
    """connect(socket_timeout=...) refuses zero, negatives and non-numbers, saying why."""
    for bad in (0, -1.0, "10", True):
        with pytest.raises(streamsub.InvalidArgumentError, match="socket_timeout"):
            streamsub.connect("redis://127.0.0.1:1/0", socket_timeout=bad)  # type: ignore[arg-type]


def test_tls_options_need_a_rediss_url() -> None:
    """A CA file with a redis:// (plain) URL is refused before connecting: it would be
    silently ignored or fail later with a confusing error."""
    with pytest.raises(streamsub.InvalidArgumentError, match=r"rediss://"):
        streamsub.connect("redis://127.0.0.1:1/0", ssl_ca_certs="/tmp/ca.pem")
    with pytest.raises(streamsub.InvalidArgumentError, match=r"ssl_ca_certs"):
        streamsub.connect("redis://127.0.0.1:1/0?ssl_ca_certs=/tmp/ca.pem")


def test_connection_options_with_a_custom_backend_are_refused(server: RedisServer) -> None:
    """socket_timeout and ssl_ca_certs belong to the Redis connection: passing them
    with backend=... is an error, not silently ignored."""
    backend = backend_class(server.url)(server.url)
    with pytest.raises(streamsub.InvalidArgumentError, match="backend"):
        streamsub.connect(backend=backend, socket_timeout=3.0)


def test_a_missing_ca_file_is_named_at_connect() -> None:
    """An ssl_ca_certs path that is not a file is refused when the client is made,
    naming the path, instead of failing later as an unreachable server."""
    for url, keyword in (
        ("rediss://127.0.0.1:1/0", "/nonexistent/ca.pem"),
        ("rediss://127.0.0.1:1/0?ssl_ca_certs=/nonexistent/ca.pem", None),
    ):
        with pytest.raises(streamsub.InvalidArgumentError, match=r"/nonexistent/ca\.pem"):
            streamsub.connect(url, ssl_ca_certs=keyword)


@pytest.mark.standalone  # one pool, each blocking read holding a connection (a cluster polls)
async def test_more_concurrent_commands_than_connections_wait_for_one(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With every pooled connection busy (two blocking reads on a pool of three, one
    of which publishing keeps), other commands wait for a free connection instead
    of failing with 'Too many connections'."""
    redis_client.flushall()
    backend = backend_class(server.url)(server.url, max_connections=3)
    try:
        topic = await backend.create_topic(TopicRecord("busy", 1, "", time.time()))
        await backend.append(topic, {0: b""})  # the publishing connection takes one
        redis_client.xgroup_create(stream_key(redis_client, "busy", 0), "readers", id="$")
        reads = [
            asyncio.ensure_future(backend.read(topic, "readers", f"r{i}", [0], 1, 500))
            for i in range(2)
        ]
        await until(
            lambda: redis_client.info("clients")["blocked_clients"] == 2, 5, "two blocked reads"
        )
        lookups = await asyncio.gather(*(backend.get_topic("busy") for _ in range(4)))
        assert lookups == [topic] * 4
        assert await asyncio.gather(*reads) == [[], []]
    finally:
        await backend.close()


@pytest.mark.standalone  # one server's pool
async def test_a_close_while_a_send_checks_an_idle_connection_hands_it_to_no_one_else(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publishing connection, idle past its health-check interval, is
    PINGed by the first of five calls, and closed while the PING's reply is
    held. Once the reply comes, every call fails as closed, nothing is
    written, no call waits for ever, and the connection goes back to the pool
    only then: another command of the client, which takes it from the pool
    at once, gets its reply."""
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    admin = aioredis.Redis.from_url(server.url)
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=0.01)
    gate = asyncio.Event()
    try:
        await admin.delete("written-after-close")
        pooled, reached = await _idle_with_replies_held(connection, gate, monkeypatch)
        calls = [
            asyncio.ensure_future(connection.call_many([("INCR", "written-after-close")]))
            for _ in range(5)
        ]
        async with asyncio.timeout(2):
            await reached.wait()
        closing = asyncio.ensure_future(connection.close())
        await asyncio.sleep(0.05)
        assert not closing.done()  # it waits for the send that holds the connection
        assert not _pool_has(client, pooled)
        gate.set()
        await _all_closed(calls)
        await asyncio.wait_for(closing, 2)
        assert await admin.get("written-after-close") is None
        monkeypatch.undo()
        assert _pool_has(client, pooled)
        async with asyncio.timeout(2):
            assert await client.execute_command("ECHO", "mine") == b"mine"
    finally:
        gate.set()
        await connection.close()
        await client.aclose()
        await admin.aclose()


@pytest.mark.standalone  # one server, paused
async def test_a_close_ends_a_send_stuck_checking_a_silent_connection_at_once(
    server: RedisServer,
) -> None:
    """The server stops answering (CLIENT PAUSE, 2 s) as the first of five
    calls PINGs the idle publishing connection. A close then ends within a
    second, not at the calls' 5 s time limit, and every call fails as
    closed, nothing written."""
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=0.01)
    try:
        async with aioredis.Redis.from_url(server.url) as admin:
            await admin.delete("written-while-paused")
            assert await connection.call_many([("PING",)]) == [b"PONG"]
            await asyncio.sleep(0.05)  # idle past the interval: the next send PINGs first
            await admin.execute_command("CLIENT", "PAUSE", "2000", "ALL")
        calls = [
            asyncio.ensure_future(connection.call_many([("INCR", "written-while-paused")]))
            for _ in range(5)
        ]
        await asyncio.sleep(0.2)  # the first holds the connection, its PING unanswered
        async with asyncio.timeout(1):
            await connection.close()
            await _all_closed(calls)
        await asyncio.sleep(2)  # the pause ends
        async with aioredis.Redis.from_url(server.url) as admin:
            assert await admin.get("written-while-paused") is None
    finally:
        await connection.close()
        await client.aclose()


@pytest.mark.standalone  # one server's pool
async def test_a_cancelled_close_gives_the_connection_back_only_once_the_send_lets_go(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close runs while the first of five calls holds the idle connection,
    its PING's reply held (as in ``..._hands_it_to_no_one_else``); the close is
    cancelled. The connection stays out of the pool until the reply comes,
    then goes back, and every call fails as closed."""
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=0.01)
    gate = asyncio.Event()
    try:
        pooled, reached = await _idle_with_replies_held(connection, gate, monkeypatch)
        calls = [asyncio.ensure_future(connection.call_many([("PING",)])) for _ in range(5)]
        async with asyncio.timeout(2):
            await reached.wait()
        closing = asyncio.ensure_future(connection.close())
        await asyncio.sleep(0.05)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        await asyncio.sleep(0.05)
        assert not _pool_has(client, pooled)  # the send still holds it
        gate.set()
        await _all_closed(calls)
        await until(lambda: _pool_has(client, pooled), 2, "the connection back in the pool")
    finally:
        gate.set()
        await connection.close()
        await client.aclose()


def _connections_received(server: RedisServer) -> int:
    """Connections the server has accepted so far (this count's own among them)."""
    with redis.Redis.from_url(server.url) as admin:
        return int(admin.info("stats")["total_connections_received"])


async def _idle_with_replies_held(
    connection: InOrderConnection, gate: asyncio.Event, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, asyncio.Event]:
    """Connect ``connection`` (its health-check interval short), hold each reply
    read on it until ``gate`` opens, and let it idle past the interval, so that
    the next send PINGs first. Return its redis-py connection, and the event set
    once a read waits at the gate."""
    assert await connection.call_many([("PING",)]) == [b"PONG"]
    pooled = connection._connection
    read_response, reached = pooled.read_response, asyncio.Event()

    async def held(*args: object, **kwargs: object) -> object:
        reached.set()
        await gate.wait()
        return await read_response(*args, **kwargs)

    monkeypatch.setattr(pooled, "read_response", held)
    await asyncio.sleep(0.05)
    return pooled, reached


async def _all_closed(calls: Sequence[asyncio.Future[Any]]) -> None:
    """Each of ``calls`` ends within 2 s, failed as closed."""
    async with asyncio.timeout(2):
        results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        assert isinstance(result, redis.ConnectionError), result
        assert "closed" in str(result)


def _pool_has(client: aioredis.Redis, connection: object) -> bool:
    """Whether ``connection`` is back among ``client``'s pool's free ones."""
    return connection in client.connection_pool._available_connections


async def test_appends_in_flight_at_a_backend_close_and_after_it_fail_as_closed(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Ten appends to four partitions of a topic are in flight as the backend
    closes, and ten more to another topic come after. Each of the first ends
    stored or with ClosedError (it may have run), none waits for ever; each
    of the later fails with ClosedError at once, stores nothing and opens no
    connection."""
    backend = backend_class(server.url)(server.url)
    racing_topic = await backend.create_topic(TopicRecord("closing", 4, "", time.time()))
    later_topic = await backend.create_topic(TopicRecord("closed", 4, "", time.time()))
    batch = {p: pack_data([b"m%d" % p], [2]) for p in range(4)}
    results = await backend.append(racing_topic, batch)
    assert all(len(ids) == 1 for ids in results.values()), results  # type: ignore[arg-type]
    racing = [asyncio.ensure_future(backend.append(racing_topic, batch)) for _ in range(10)]
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await backend.close()
        outcomes = await asyncio.gather(*racing, return_exceptions=True)
    stored = 0
    for outcome in outcomes:
        if isinstance(outcome, dict):
            for result in outcome.values():
                if isinstance(result, list):
                    assert len(result) == 1
                    stored += 1
                else:
                    assert isinstance(result, streamsub.ClosedError), result
        else:
            assert isinstance(outcome, streamsub.ClosedError), outcome
    cluster = isinstance(server, RedisClusterServers)  # whose clients connect by themselves
    received = 0 if cluster else _connections_received(server)
    for _ in range(10):
        async with asyncio.timeout(1):
            with pytest.raises(streamsub.ClosedError, match="closed"):
                await backend.append(later_topic, batch)
    if cluster:
        assert not backend._appender._connections
    else:
        assert _connections_received(server) == received + 1  # the count's own
    # Those failed in flight may still be landing: only the bounds hold here.
    landed = [redis_client.xlen(key) for key in stream_keys(redis_client, "closing", 4)]
    assert 4 + stored <= sum(landed) <= 44
    assert [redis_client.xlen(key) for key in stream_keys(redis_client, "closed", 4)] == [0] * 4


@pytest.mark.standalone  # one server's connection
async def test_closing_the_publishing_connection_fails_the_calls_in_flight(
    server: RedisServer,
) -> None:
    """The publishing connection is closed with three calls in flight (a BLPOP
    that waits 2 s, two INCRs behind it): each call ends at once with
    ConnectionError, none waits for ever for a reply nobody reads."""
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    try:
        calls = [
            asyncio.ensure_future(connection.call_many([command]))
            for command in (("BLPOP", "nothing-here", "2"), ("INCR", "n"), ("INCR", "n"))
        ]
        await until(lambda: len(connection._waiting) == 3, 5, "three calls in flight")
        await connection.close()
        async with asyncio.timeout(1):
            results = await asyncio.gather(*calls)
        for (reply,) in results:
            assert isinstance(reply, redis.ConnectionError), reply
    finally:
        await connection.close()
        await client.aclose()


@pytest.mark.standalone  # one server's pool, held
async def test_a_close_while_sends_wait_for_a_connection_leaves_none_taken(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five calls wait for the publishing connection while the pool is held
    handing one out, and the connection is closed meanwhile. Once the pool
    answers, every call fails with ConnectionError, nothing is written, and
    the pool has no connection in use: none is kept by the closed object.
    A call after the close fails at once."""
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    admin = aioredis.Redis.from_url(server.url)
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    pool = client.connection_pool
    get_connection, gate = pool.get_connection, asyncio.Event()
    asked = 0

    @functools.wraps(get_connection)  # its signature: redis-py 5.0 wants a command name
    async def held(*args: object) -> object:
        nonlocal asked
        asked += 1
        await gate.wait()
        return await get_connection(*args)

    try:
        await admin.delete("written-after-close")
        monkeypatch.setattr(pool, "get_connection", held)
        calls = [
            asyncio.ensure_future(connection.call_many([("INCR", "written-after-close")]))
            for _ in range(5)
        ]
        await until(lambda: asked == 1, 5, "a call asks the pool for a connection")
        closing = asyncio.ensure_future(connection.close())
        await asyncio.sleep(0.05)
        gate.set()
        await _all_closed(calls)
        await asyncio.wait_for(closing, 2)
        assert not pool._in_use_connections
        with pytest.raises(redis.ConnectionError, match="closed"):
            await connection.call_many([("INCR", "written-after-close")])
        assert asked == 1
        assert await admin.get("written-after-close") is None
    finally:
        gate.set()
        await connection.close()
        await client.aclose()
        await admin.aclose()


@pytest.mark.standalone  # one server's connection
async def test_calls_sent_while_the_broken_connections_reader_ends_get_their_replies(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server kills the publishing connection while a call waits on it; the
    reader, giving the broken connection back to the pool, is held there. Ten
    calls sent meanwhile go out once it has ended, on a new connection, and
    each gets its reply: none waits for ever for a reader nobody started."""
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    admin = aioredis.Redis.from_url(server.url)
    connection = InOrderConnection(client, timeout=5.0, health_check_interval=3600.0)
    pool = client.connection_pool
    release, gate = pool.release, asyncio.Event()

    async def held(returned: object) -> None:
        await gate.wait()
        await release(returned)

    try:
        await admin.delete("after-the-break")
        (client_id,) = await connection.call_many([("CLIENT", "ID")])
        monkeypatch.setattr(pool, "release", held)
        blocked = asyncio.ensure_future(connection.call_many([("BLPOP", "nothing-here", "5")]))
        await until(lambda: len(connection._waiting) == 1, 5, "BLPOP in flight")
        await asyncio.sleep(0.05)  # its reader waits for the reply
        await admin.client_kill_filter(_id=client_id)
        async with asyncio.timeout(2):
            (lost,) = await blocked
        assert isinstance(lost, redis.ConnectionError), lost
        calls = [
            asyncio.ensure_future(connection.call_many([("INCR", "after-the-break")]))
            for _ in range(10)
        ]
        await asyncio.sleep(0.2)  # the reader is still held, giving the old one back
        gate.set()
        async with asyncio.timeout(2):
            replies = [reply for (reply,) in await asyncio.gather(*calls)]
        assert sorted(replies) == list(range(1, 11))
    finally:
        gate.set()
        await connection.close()
        await client.aclose()
        await admin.aclose()


@pytest.mark.standalone  # a TCP proxy in front of the one server
async def test_a_reader_left_waiting_on_a_dead_socket_touches_no_later_connection(
    server: RedisServer, proxy: Proxy
) -> None:
    """The publishing connection goes silent (dropped by the network) with ten
    calls in flight; a large write behind them stalls and its caller cancels it,
    which breaks the connection, while its reader waits on the dead socket
    (which cannot close before its unsent bytes go). Another command of the
    client takes the pool's connection object at once, and ten new calls go
    out on a new connection and get their replies within the time limit. Past
    the old reader's time limit, the other command's connection is still the
    one it opened: the old reader disconnected nothing it did not own."""
    port = await proxy.start("127.0.0.1", server.port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
    admin = aioredis.Redis.from_url(server.url)
    connection = InOrderConnection(client, timeout=2.0, health_check_interval=3600.0)
    other = None
    try:
        await admin.delete("counted")
        assert await connection.call_many([("PING",)]) == [b"PONG"]
        proxy.drop()
        lost = [
            asyncio.ensure_future(connection.call_many([("INCR", "counted")])) for _ in range(10)
        ]
        await until(lambda: len(connection._waiting) == 10, 5, "ten calls in flight")
        await asyncio.sleep(0.05)  # their reader waits for the first reply
        stalled = asyncio.ensure_future(connection.call_many([("SET", "large", b"x" * (64 << 20))]))
        await asyncio.sleep(0.3)  # its write fills the socket's buffers, then waits
        assert not stalled.done()
        stalled.cancel()
        for call in lost:
            (reply,) = await call
            assert isinstance(reply, redis.ConnectionError), reply
        other = await take_connection(client.connection_pool)

        async def other_id() -> object:
            await other.send_command("CLIENT", "ID")
            return await other.read_response()

        first_id = await other_id()
        async with asyncio.timeout(1.5):  # within the old reader's time limit
            replies = await asyncio.gather(
                *(connection.call_many([("INCR", "counted")]) for _ in range(10))
            )
        assert sorted(reply for (reply,) in replies) == list(range(1, 11))
        await asyncio.sleep(2.2)  # past the old reader's time limit
        assert await other_id() == first_id
        assert await connection.call_many([("INCR", "counted")]) == [11]
    finally:
        if other is not None:
            await client.connection_pool.release(other)
        await connection.close()
        await client.aclose()
        await admin.aclose()
