"""``rediss+cluster://`` (issue 9, "What to build 1"): a one-node Redis Cluster
that speaks TLS only (tls-cluster yes, every slot on it) carries a round trip
through each URL form."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator

import pytest
import redis

import streamsub
from streamsub import StreamsubError
from streamsub._cluster_server import _free_port_pair
from streamsub.testing import RedisServer, TlsFiles, make_tls_files, redis_server


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_binary: str | None
) -> Iterator[tuple[RedisServer, TlsFiles]]:
    files = make_tls_files(tmp_path_factory.mktemp("tls"))
    try:
        with redis_server(
            tmp_path_factory.mktemp("redis-tls-cluster"),
            tls=files,
            port=_free_port_pair(),  # its cluster bus port, + 10000, must exist and be free
            binary=redis_binary,
            extra_args=("--cluster-enabled", "yes", "--tls-cluster", "yes"),
        ) as running:
            node = redis.Redis(
                host="127.0.0.1", port=running.port, ssl=True, ssl_ca_certs=str(files.ca_cert)
            )
            try:
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
                deadline = time.monotonic() + 10
                while b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
                    assert time.monotonic() < deadline, "the one-node cluster never got ready"
                    time.sleep(0.05)
            finally:
                node.close()
            yield running, files
    except StreamsubError as exc:
        if "tls-port" in str(exc) and "Bad directive" in str(exc):
            pytest.skip("this redis-server was built without TLS")
        raise


@pytest.mark.parametrize("form", ["query", "slash-query", "keyword"])
async def test_rediss_cluster_url_publishes_and_delivers_over_tls(
    tls_cluster: tuple[RedisServer, TlsFiles], form: str
) -> None:
    """rediss+cluster://host:port?ssl_ca_certs=<CA> (the form README and the
    URL error message show: no path), .../?ssl_ca_certs=<CA>, and the URL with
    the ssl_ca_certs keyword each verify the node and carry 1,000 messages on 4
    partitions to two subscribers, each once; the CA file's path holds '/', which
    is part of the query, not a database path."""
    server, files = tls_cluster
    base = f"rediss+cluster://127.0.0.1:{server.port}"
    topic = f"tls-{form}"
    if form == "keyword":
        connecting = streamsub.connect(base, ssl_ca_certs=str(files.ca_cert))
    else:
        slash = "/" if form == "slash-query" else ""
        connecting = streamsub.connect(f"{base}{slash}?ssl_ca_certs={files.ca_cert}")
    async with connecting as client:
        await client.create_topic(topic, partitions=4)
        await client.create_subscription(f"{topic}-sub", topic=topic)
        ids = await client.publish_many(topic, [b"m%d" % i for i in range(1000)])
        seen: collections.Counter[str] = collections.Counter()
        done = asyncio.Event()

        async def handler(message: streamsub.Message) -> None:
            seen[message.message_id] += 1
            if len(seen) == len(ids):
                done.set()

        async with (
            client.subscribe(f"{topic}-sub", handler, consumer="a"),
            client.subscribe(f"{topic}-sub", handler, consumer="b"),
        ):
            await asyncio.wait_for(done.wait(), 30)
    assert set(seen) == set(ids)
    assert set(seen.values()) == {1}
