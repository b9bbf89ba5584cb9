"""Where streamsub keeps things in Redis.

Each topic-partition's keys carry their own hash tag, so that on Redis Cluster
partitions spread over the masters and the partition's companion keys (which
share the tag) stay in one slot for single-slot Lua steps. Records are hashes;
registries are sets.

Layout ``v1`` (standalone servers, and every topic created before layout
``v2``): partition ``n``'s tag is ``<topic>.<n>``, its stream ``ss:{<topic>.<n>}``.
Layout ``v2`` (topics created on Redis Cluster): the tag is ``<topic>.<n>`` or,
with the partition's salt ``s > 0``, ``<topic>.<n>|<s>`` (``|`` is never part
of a topic name); the salts, stored with the topic, were chosen so that the
partitions spread evenly over the masters that served the slots when the
topic was created (``_slots.py``).
"""

from __future__ import annotations

__all__ = [
    "CLUSTER_LAYOUT",
    "LAYOUT",
    "SUBSCRIPTIONS",
    "TOPICS",
    "SNAPSHOTS",
    "delay_key",
    "claims_key",
    "dropped_key",
    "fence_key",
    "holds_key",
    "labels_key",
    "link_key",
    "link_pattern",
    "lock_key",
    "members_key",
    "partition_tag",
    "owners_key",
    "seek_key",
    "snapshot_key",
    "stream_key",
    "subscription_key",
    "times_key",
    "topic_key",
    "wake_channel",
]

LAYOUT = "v1"
"""The layout of topics created on a standalone server."""
CLUSTER_LAYOUT = "v2"
"""The layout of topics created on Redis Cluster: per-partition salts."""
TOPICS = "ss:topics"
SUBSCRIPTIONS = "ss:subscriptions"
SNAPSHOTS = "ss:snapshots"


def topic_key(name: str) -> str:
    """The hash holding a topic's record."""
    return f"ss:topic:{name}"


def subscription_key(name: str) -> str:
    """The hash holding a subscription's record."""
    return f"ss:sub:{name}"


def partition_tag(topic: str, partition: int, salt: int = 0) -> str:
    """The hash tag (without braces) of one partition's keys."""
    return f"{topic}.{partition}|{salt}" if salt else f"{topic}.{partition}"


def stream_key(tag: str) -> str:
    """The stream of the partition whose tag is ``tag``."""
    return f"ss:{{{tag}}}"


def link_key(stream: str, writer: str) -> str:
    """A publisher's last stored write to the partition ``stream`` (its number,
    expiring after a minute), which the writes it has in flight behind it check;
    it shares the stream's tag."""
    return f"{stream}:link:{writer}"


def wake_channel(stream: str) -> str:
    """The shard channel (``SSUBSCRIBE``) on which appends to the partition
    ``stream`` announce themselves on Redis Cluster (an empty message), so idle
    readers poll at once; it shares the stream's tag, so it is in its slot."""
    return f"{stream}:wake"


def link_pattern(topic: str) -> str:
    """A SCAN pattern that finds every link of ``topic``'s partitions (and maybe of
    other topics whose names start alike: check the stream part)."""
    return f"ss:{{{topic}.*}}:link:*"


def delay_key(tag: str, group: str) -> str:
    """The sorted set of a group's entries nacked with a delay longer than the
    ack deadline (score: when they are due, ms); it shares the stream's tag."""
    return f"ss:{{{tag}}}:delay:{group}"


def times_key(tag: str, group: str) -> str:
    """The hash of a group's first and last delivery times (``first:last`` ms) of
    entries that were nacked; it shares the stream's tag."""
    return f"ss:{{{tag}}}:times:{group}"


def fence_key(tag: str, group: str) -> str:
    """The fencing token of the owner of an ordered subscription's partition, the
    only one whose reads of it Redis serves (fence.lua); it shares the stream's
    tag."""
    return f"ss:{{{tag}}}:fence:{group}"


def seek_key(tag: str, group: str) -> str:
    """The set of ids a running seek of ``group`` made pending again; it shares
    the stream's tag."""
    return f"ss:{{{tag}}}:seek:{group}"


def dropped_key(tag: str) -> str:
    """The counter of unacknowledged entries that retention dropped from one
    partition (only with ``drop_unacked=True``); it shares the stream's tag."""
    return f"ss:{{{tag}}}:dropped"


def claims_key(tag: str) -> str:
    """The hash of a partition's entries claimed by a dead-letter replay (entry
    id -> claim expiry, server ms); it shares the stream's tag."""
    return f"ss:{{{tag}}}:claims"


def holds_key(tag: str) -> str:
    """The hash of live snapshots' holds on one partition (snapshot name ->
    ``"<lowest id it needs> <expiry, server ms>"``), written in the step that
    reads the positions and read by the trim step; it shares the stream's tag."""
    return f"ss:{{{tag}}}:holds"


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
