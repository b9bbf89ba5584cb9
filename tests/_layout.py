"""Where a test finds streamsub's keys, on a standalone server or a cluster."""

from __future__ import annotations

import os

import redis

from streamsub._backends.redis import RedisBackend, RedisClusterBackend, _keys


def partition_tag(redis_client: redis.Redis, topic: str, partition: int | str) -> str:
    """The hash tag of ``topic``'s ``partition`` (without braces), as the topic's stored
    layout names it: ``<topic>.<n>|<salt>`` on a cluster, ``<topic>.<n>`` otherwise."""
    salts = (redis_client.hget(_keys.topic_key(topic), "salts") or b"").split()
    partition = int(partition)  # a message id's first part, say
    salt = int(salts[partition]) if salts else 0
    return _keys.partition_tag(topic, partition, salt)


def stream_key(redis_client: redis.Redis, topic: str, partition: int | str) -> str:
    """The stream of ``topic``'s ``partition``, as the topic's stored layout names it
    (its salts on a cluster, the plain ``ss:{<topic>.<n>}`` otherwise)."""
    return _keys.stream_key(partition_tag(redis_client, topic, partition))


def stream_keys(redis_client: redis.Redis, topic: str, partitions: int) -> list[str]:
    """The streams of ``topic``'s partitions 0 .. ``partitions``-1."""
    return [stream_key(redis_client, topic, p) for p in range(partitions)]


def all_keys(redis_client: redis.Redis, pattern: str = "*") -> list[bytes]:
    """Every key matching ``pattern``: on a cluster, those of every master (redis-py
    sends a plain KEYS to one node only)."""
    if isinstance(redis_client, redis.RedisCluster):
        keys = redis_client.keys(pattern, target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        keys = redis_client.keys(pattern)
    return list(keys)


def _first_node(url: str) -> tuple[str, int]:
    host, _, port = node_urls(url)[0].split("://", 1)[1].split("/")[0].rpartition(":")
    return host.strip("[]"), int(port)


def node_urls(url: str) -> list[str]:
    """A plain ``redis://`` URL for each node a test URL names (one for a standalone
    server), for what must be set on every node (ACL users, configuration)."""
    if "+cluster://" not in url:
        return [url]
    nodes = url.split("://", 1)[1].split("/")[0].split(",")
    return [f"redis://{node}/0" for node in nodes]


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` (a test server's, without credentials) logging in as ``user``."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{user}:{password}@{rest}"


def inspector(url: str) -> redis.Redis:
    """A synchronous client on the server at ``url`` (a cluster-aware one for a
    ``redis+cluster://`` URL), for a test or a test's subprocess to inspect state."""
    if "+cluster://" in url:
        host, port = _first_node(url)
        return redis.RedisCluster(host=host, port=port)  # type: ignore[return-value]
    return redis.Redis.from_url(url)


def node_url_for_key(url: str, key: str) -> str:
    """A plain ``redis://`` URL of the node that holds ``key`` (``url`` itself on a
    standalone server)."""
    if "+cluster://" not in url:
        return url
    with inspector(url) as client:
        node = client.get_node_from_key(key)  # type: ignore[attr-defined]
    return f"redis://{node.host}:{node.port}/0"


TEST_BACKEND: type[RedisBackend] = (
    RedisClusterBackend if os.environ.get("STREAMSUB_TEST_BACKEND") == "cluster" else RedisBackend
)
"""The backend class of the session's server, for tests that subclass it."""


def backend_class(url: str) -> type[RedisBackend]:
    """The backend class that ``streamsub.connect(url)`` uses, to subclass in a test."""
    return RedisClusterBackend if "+cluster://" in url else RedisBackend


def command_calls(redis_client: redis.Redis) -> dict[str, int]:
    """Calls per command (``cmdstat_<name>`` -> calls) since the last reset, summed
    over the masters on a cluster."""
    if isinstance(redis_client, redis.RedisCluster):
        per_node = redis_client.info("commandstats", target_nodes=redis.RedisCluster.PRIMARIES)
        stats = list(per_node.values())
    else:
        stats = [redis_client.info("commandstats")]
    calls: dict[str, int] = {}
    for node in stats:
        for name, value in node.items():
            calls[name] = calls.get(name, 0) + int(value["calls"])
    return calls


def log_every_command(node: redis.Redis) -> None:
    """Make one server's slow log keep every command it runs from now on, with
    its arguments (up to 100,000 of them)."""
    node.config_set("slowlog-max-len", 100_000)
    node.config_set("slowlog-log-slower-than", 0)
    node.slowlog_reset()


def commands_logged(node: redis.Redis, name: bytes) -> list[list[bytes]]:
    """The ``name`` commands in one server's slow log, each split into its
    arguments (see :func:`log_every_command`)."""
    return [
        entry["command"].split()
        for entry in node.slowlog_get(100_000)
        if entry["command"].upper().startswith(name + b" ")
    ]


def reset_stats(redis_client: redis.Redis) -> None:
    """CONFIG RESETSTAT on the server, or on every master of a cluster."""
    if isinstance(redis_client, redis.RedisCluster):
        redis_client.config_resetstat(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        redis_client.config_resetstat()


def pause_writes(redis_client: redis.Redis, milliseconds: int) -> None:
    """CLIENT PAUSE ... WRITE on the server, or on every master of a cluster."""
    if isinstance(redis_client, redis.RedisCluster):
        redis_client.execute_command(
            "CLIENT", "PAUSE", milliseconds, "WRITE", target_nodes=redis.RedisCluster.PRIMARIES
        )
    else:
        redis_client.execute_command("CLIENT", "PAUSE", milliseconds, "WRITE")


def unpause_writes(redis_client: redis.Redis) -> None:
    """CLIENT UNPAUSE on the server, or on every master of a cluster."""
    if isinstance(redis_client, redis.RedisCluster):
        redis_client.execute_command("CLIENT", "UNPAUSE", target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        redis_client.execute_command("CLIENT", "UNPAUSE")


def config_set(redis_client: redis.Redis, name: str, value: str | int) -> None:
    """CONFIG SET on the server, or on every master of a cluster (redis-py sends it
    to one node only)."""
    if isinstance(redis_client, redis.RedisCluster):
        redis_client.config_set(name, value, target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        redis_client.config_set(name, value)
