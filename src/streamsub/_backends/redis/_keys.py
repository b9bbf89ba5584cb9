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
    "SNAPSHOTS",
    "delay_key",
    "claims_key",
    "dropped_key",
    "holds_key",
    "labels_key",
    "link_key",
    "link_pattern",
    "lock_key",
    "members_key",
    "owners_key",
    "snapshot_key",
    "stream_key",
    "subscription_key",
    "times_key",
    "topic_key",
]

LAYOUT = "v1"
TOPICS = "ss:topics"
SUBSCRIPTIONS = "ss:subscriptions"
SNAPSHOTS = "ss:snapshots"


def topic_key(name: str) -> str:
    """The hash holding a topic's record."""
    return f"ss:topic:{name}"


def subscription_key(name: str) -> str:
    """The hash holding a subscription's record."""
    return f"ss:sub:{name}"


def stream_key(topic: str, partition: int) -> str:
    """The stream of one partition of ``topic``."""
    return f"ss:{{{topic}.{partition}}}"


def link_key(stream: str, writer: str) -> str:
    """A publisher's last stored write to the partition ``stream`` (its number,
    expiring after a minute), which the writes it has in flight behind it check;
    it shares the stream's tag."""
    return f"{stream}:link:{writer}"


def link_pattern(topic: str) -> str:
    """A SCAN pattern that finds every link of ``topic``'s partitions (and maybe of
    other topics whose names start alike: check the stream part)."""
    return f"ss:{{{topic}.*}}:link:*"


def delay_key(topic: str, partition: int, group: str) -> str:
    """The sorted set of a group's entries nacked with a delay longer than the
    ack deadline (score: when they are due, ms); it shares the stream's tag."""
    return f"ss:{{{topic}.{partition}}}:delay:{group}"


def times_key(topic: str, partition: int, group: str) -> str:
    """The hash of a group's first and last delivery times (``first:last`` ms) of
    entries that were nacked; it shares the stream's tag."""
    return f"ss:{{{topic}.{partition}}}:times:{group}"


def dropped_key(topic: str, partition: int) -> str:
    """The counter of unacknowledged entries that retention dropped from one
    partition (only with ``drop_unacked=True``); it shares the stream's tag."""
    return f"ss:{{{topic}.{partition}}}:dropped"


def claims_key(topic: str, partition: int) -> str:
    """The hash of a partition's entries claimed by a dead-letter replay (entry
    id -> claim expiry, server ms); it shares the stream's tag."""
    return f"ss:{{{topic}.{partition}}}:claims"


def holds_key(topic: str, partition: int) -> str:
    """The hash of live snapshots' holds on one partition (snapshot name ->
    ``"<lowest id it needs> <expiry, server ms>"``), written in the step that
    reads the positions and read by the trim step; it shares the stream's tag."""
    return f"ss:{{{topic}.{partition}}}:holds"


def lock_key(name: str) -> str:
    """A lock (a string with its holder's token and an expiry), e.g.
    ``retention:<topic>`` for the one trimmer of a topic."""
    return f"ss:lock:{name}"


def snapshot_key(name: str) -> str:
    """The hash holding a snapshot: its subscription, topic, and per partition
    the last delivered id and the pending ids."""
    return f"ss:snapshot:{name}"


def labels_key(kind: str, name: str) -> str:
    """The hash of a topic's or subscription's Pub/Sub labels (the gateway's)."""
    return f"ss:labels:{kind}:{name}"


def members_key(group: str) -> str:
    """The sorted set of an ordered subscription's live subscribers (-> lease
    expiry, server ms); its owners hash shares the tag."""
    return f"ss:{{own.{group}}}:members"


def owners_key(group: str) -> str:
    """The hash of an ordered subscription's partition owners (partition ->
    ``"<subscriber> <fencing token> <expiry ms>"``, ``t<partition>`` -> the last
    token handed out)."""
    return f"ss:{{own.{group}}}:owners"
