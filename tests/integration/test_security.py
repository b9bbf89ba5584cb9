"""TLS and ACL users on real redis-servers: a private CA and a TLS-only server per
module, ACL users created with ``ACL SETUSER`` on a private server per test (on
every node of the session's cluster under ``STREAMSUB_TEST_BACKEND=cluster``)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import streamsub
from streamsub import StreamsubError
from streamsub._backends.redis._backend import SOCKET_TIMEOUT
from streamsub.testing import (
    ACL_RULE,
    RedisServer,
    TlsFiles,
    make_tls_files,
    redis_server,
)
from tests._layout import node_urls, with_credentials
from tests._wait import until
from tests.conftest import ON_CLUSTER

README = Path(__file__).parents[2] / "README.md"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A private CA and a certificate for 127.0.0.1 that it signed."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles, redis_binary: str | None
) -> Iterator[RedisServer]:
    """A redis-server that speaks TLS only, with tls_files' certificate."""
    try:
        with redis_server(
            tmp_path_factory.mktemp("redis-tls"), tls=tls_files, binary=redis_binary
        ) as running:
            yield running
    except StreamsubError as exc:
        if "tls-port" in str(exc) and "Bad directive" in str(exc):
            pytest.skip("this redis-server was built without TLS")
        raise


async def _round_trip(client: streamsub.Client, topic: str) -> None:
    await client.create_topic(topic, partitions=2)
    await client.create_subscription(f"{topic}-sub", topic=topic)
    message_id = await client.publish(topic, b"over tls")
    received: list[streamsub.Message] = []

    async def handler(message: streamsub.Message) -> None:
        received.append(message)

    async with client.subscribe(f"{topic}-sub", handler):
        await until(lambda: received, 10, "the message over TLS")
    assert received[0].message_id == message_id
    assert received[0].data == b"over tls"


@pytest.mark.tls
@pytest.mark.standalone  # a private TLS-only server
async def test_tls_with_the_ca_in_the_url(tls_server: RedisServer, tls_files: TlsFiles) -> None:
    """rediss:// with ?ssl_ca_certs=<CA file> verifies the server and carries
    publishing and subscribing."""
    async with streamsub.connect(f"{tls_server.url}?ssl_ca_certs={tls_files.ca_cert}") as client:
        await _round_trip(client, "tls-url")


@pytest.mark.tls
@pytest.mark.standalone  # a private TLS-only server
async def test_tls_with_the_ca_as_a_keyword(tls_server: RedisServer, tls_files: TlsFiles) -> None:
    """connect(rediss://..., ssl_ca_certs=<CA file>) works the same as the URL form."""
    async with streamsub.connect(tls_server.url, ssl_ca_certs=tls_files.ca_cert) as client:
        await _round_trip(client, "tls-keyword")


@pytest.mark.tls
@pytest.mark.standalone  # a private TLS-only server
@pytest.mark.parametrize("trusted", ["another-ca", "system-cas"])
async def test_tls_with_an_untrusted_certificate_raises_certificate_error(
    tls_server: RedisServer, tmp_path: Path, trusted: str
) -> None:
    """A server certificate signed by a CA the client does not trust raises
    CertificateError (an UnavailableError) saying it could not be verified and
    what to check, with no password in the text."""
    url = tls_server.url.replace("rediss://", "rediss://:s3cret-pw@")
    ca = make_tls_files(tmp_path, name="other").ca_cert if trusted == "another-ca" else None
    with pytest.raises(streamsub.CertificateError) as info:
        async with streamsub.connect(url, ssl_ca_certs=ca):
            pass
    text = str(info.value)
    assert isinstance(info.value, streamsub.UnavailableError)
    assert "could not be verified" in text
    assert "ssl_ca_certs" in text
    assert "s3cret-pw" not in text
    assert "rediss://:***@127.0.0.1" in text


# --- ACL users --------------------------------------------------------------------
USERS = ("app", "narrow")


@pytest.fixture
def acl_server(
    request: pytest.FixtureRequest, data_dir: Path, redis_binary: str | None
) -> Iterator[RedisServer]:
    """A private server whose default user stays open, for creating ACL users (the
    emptied session cluster on a cluster, its test users deleted afterwards)."""
    if not ON_CLUSTER:
        with redis_server(data_dir, binary=redis_binary) as running:
            yield running
        return
    cluster: RedisServer = request.getfixturevalue("server")
    request.getfixturevalue("redis_client").flushall()
    yield cluster
    for url in node_urls(cluster.url):
        with redis.Redis.from_url(url) as node:
            node.acl_deluser(*USERS)


def _add_user(server: RedisServer, name: str, password: str, rule: str) -> str:
    """Create user ``name`` (on every node of a cluster); return its URL."""
    assert name in USERS
    for url in node_urls(server.url):
        with redis.Redis.from_url(url) as admin:
            admin.execute_command(
                "ACL", "SETUSER", name, "reset", "on", f">{password}", *rule.split()
            )
    return with_credentials(server.url, name, password)


def test_the_readme_quotes_the_acl_rule() -> None:
    """README's Security section shows ACL_RULE exactly, so the two cannot drift."""
    assert ACL_RULE in README.read_text().replace("\\\n", "")


@pytest.mark.timeout(60)
async def test_an_acl_user_with_the_rule_can_do_everything_streamsub_does(
    acl_server: RedisServer,
) -> None:
    """As a user holding exactly ACL_RULE: admin (create, get, list, stats, delete of
    topics and subscriptions), publishing, subscribing with acks and a nack, and
    dead-lettering all work; commands and keys outside the rule are refused."""
    url = _add_user(acl_server, "app", "app-pw", ACL_RULE)
    async with streamsub.connect(url) as client:
        await client.create_topic("orders", partitions=2)
        await client.create_topic("orders-dead", partitions=1)
        await client.create_subscription("dead-sub", topic="orders-dead")
        await client.create_subscription(
            "billing",
            topic="orders",
            ack_deadline=1.0,
            max_delivery_attempts=2,
            dead_letter_topic="orders-dead",
            retry_policy=streamsub.RetryPolicy(minimum_backoff=0.1, maximum_backoff=0.2),
        )
        assert [t.name for t in await client.list_topics()] == ["orders", "orders-dead"]
        assert [s.name for s in await client.list_subscriptions("orders")] == ["billing"]
        assert (await client.get_subscription("billing")).dead_letter_topic == "orders-dead"

        good = [f"good-{i}".encode() for i in range(20)]
        await client.publish_many("orders", good)
        await client.publish("orders", b"poison", ordering_key="p")
        handled: list[bytes] = []
        nacks: list[int] = []
        dead: list[streamsub.Message] = []

        async def handler(message: streamsub.Message) -> None:
            if message.data == b"poison":
                nacks.append(message.delivery_attempt)
                message.nack()
            else:
                handled.append(message.data)
                message.ack()

        async def dead_handler(message: streamsub.Message) -> None:
            dead.append(message)

        async with (
            client.subscribe("billing", handler, ack_mode="manual"),
            client.subscribe("dead-sub", dead_handler),
        ):
            await until(lambda: dead and set(good) <= set(handled), 30, "acks and a dead letter")
        assert nacks == [1, 2]
        assert dead[0].data == b"poison"
        assert dead[0].attributes["streamsub.delivery_attempts"] == "2"
        stats = await client.subscription_stats("billing")
        assert stats.pending == 0
        assert stats.messages == 21

        await client.delete_subscription("billing")
        await client.delete_topic("orders")
        await client.delete_topic("orders-dead", force=True)
        assert await client.list_topics() == []

    node = with_credentials(node_urls(acl_server.url)[0], "app", "app-pw")
    with redis.Redis.from_url(node) as app:
        for refused in (("FLUSHALL",), ("GET", "not-ours"), ("CONFIG", "GET", "*"), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                app.execute_command(*refused)


async def test_an_acl_user_missing_a_permission_gets_an_error_naming_the_rule(
    acl_server: RedisServer,
) -> None:
    """A user whose rule lacks stream commands gets a BackendError that says the
    user was denied and points to streamsub's ACL rule."""
    url = _add_user(acl_server, "narrow", "narrow-pw", ACL_RULE.replace("+@stream ", ""))
    async with streamsub.connect(url) as client:
        with pytest.raises(streamsub.BackendError, match=r"denied this user.*ACL rule") as info:
            await client.create_topic("orders")
    assert "narrow-pw" not in str(info.value)


@pytest.mark.parametrize("case", ["wrong-password", "disabled-user", "unknown-user"])
async def test_an_acl_user_with_bad_credentials_gets_authentication_error(
    acl_server: RedisServer, case: str
) -> None:
    """A wrong password, a disabled user or an unknown user raises AuthenticationError
    (an UnavailableError) about the credentials at once, without the password."""
    url = _add_user(acl_server, "app", "right-pw", ACL_RULE)
    if case == "wrong-password":
        url = url.replace("right-pw", "wrong-pw")
    elif case == "disabled-user":
        _add_user(acl_server, "app", "right-pw", "off " + ACL_RULE)
    else:
        url = url.replace("app:", "nobody:")
    started = time.monotonic()
    with pytest.raises(streamsub.AuthenticationError, match="credentials") as info:
        async with streamsub.connect(url):
            pass
    # At once: a connection that fails to connect must not hold up the pool (a
    # wait for it would last a socket timeout, 10 s); half that, however busy the
    # machine.
    assert time.monotonic() - started < SOCKET_TIMEOUT / 2
    assert isinstance(info.value, streamsub.UnavailableError)
    assert not re.search(r"(right|wrong)-pw", str(info.value))
