"""Where streamsub keeps things in Redis.

Layout ``v1``: each topic-partition's stream carries its own hash tag,
``ss:{<topic>.<n>}``, so that on Redis Cluster partitions spread over the
masters and the partition's companion keys (which share the tag) stay in one
slot for single-slot Lua steps. Records are hashes; registries are sets.
"""

from __future__ import annotations

__all__ = [
    "LAYOUT",
    "SUBSCRIPTIONS",
    "TOPICS",
    "delay_key",
    "labels_key",
    "stream_key",
    "subscription_key",
    "times_key",
    "topic_key",
]

LAYOUT = "v1"
TOPICS = "ss:topics"
SUBSCRIPTIONS = "ss:subscriptions"


def topic_key(name: str) -> str:
    """The hash holding a topic's record."""
    return f"ss:topic:{name}"


def subscription_key(name: str) -> str:
    """The hash holding a subscription's record."""
    return f"ss:sub:{name}"


def stream_key(topic: str, partition: int) -> str:
    """The stream of one partition of ``topic``."""
    return f"ss:{{{topic}.{partition}}}"


def delay_key(topic: str, partition: int, group: str) -> str:
    """The sorted set of a group's entries nacked with a delay longer than the
    ack deadline (score: when they are due, ms); it shares the stream's tag."""
    return f"ss:{{{topic}.{partition}}}:delay:{group}"


def times_key(topic: str, partition: int, group: str) -> str:
    """The hash of a group's first and last delivery times (``first:last`` ms) of
    entries that were nacked; it shares the stream's tag."""
    return f"ss:{{{topic}.{partition}}}:times:{group}"


def labels_key(kind: str, name: str) -> str:
    """The hash of a topic's or subscription's Pub/Sub labels (the gateway's)."""
    return f"ss:labels:{kind}:{name}"
