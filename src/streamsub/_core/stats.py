"""Operator statistics: per-partition raw counts in, frozen reports out.

The backend reads each partition in one step (``PartitionCounts``); the
functions here sum them into a :class:`TopicReport` per topic and a
:class:`SubscriptionReport` per subscription, given ``now``. No I/O.

Bounds (each documented where it applies): the publish rate reads at most the
newest ``RATE_SAMPLE`` entries per partition of the last ``RATE_WINDOW``
seconds (by the server's clock); the delivery-attempt distribution samples the
``ATTEMPT_SAMPLE`` oldest pending entries per partition; a backlog the server
cannot report (Redis 6.2, or after a seek or deletions) is the stream's length
when nothing left in it was delivered, else counted up to ``BACKLOG_CAP`` per
partition.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from collections.abc import Mapping, Sequence

from .retention import Retention
from .streamid import id_ms

__all__ = [
    "ATTEMPT_SAMPLE",
    "BACKLOG_CAP",
    "RATE_SAMPLE",
    "RATE_WINDOW",
    "GroupCounts",
    "PartitionCounts",
    "PartitionReport",
    "Stats",
    "SubscriptionReport",
    "TopicReport",
    "subscription_report",
    "topic_report",
]

RATE_WINDOW = 10.0
"""Seconds of entry ids the publish rate is measured over."""
RATE_SAMPLE = 1000
"""The newest entries per partition read for the rate at most: up to 100
messages/s per partition the rate is exact; above, it is those entries' count
over the time they span (their ids), so ``stats()`` stays cheap on busy topics."""
ATTEMPT_SAMPLE = 1000
"""Oldest pending entries per partition whose delivery counts are sampled."""
BACKLOG_CAP = 1000
"""Undelivered entries per partition counted at most when the server has no lag
and some of the stream was delivered (then the backlog reported is a floor)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GroupCounts:
    """One subscription's raw counts on one partition."""

    name: str
    pending: int
    last_delivered_id: str
    backlog: int
    first_pending_id: str | None
    first_undelivered_id: str | None
    consumers: Mapping[str, int]
    attempts: Sequence[int]


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionCounts:
    """One partition's raw counts."""

    partition: int
    length: int
    memory: int | None
    recent: int
    """Entries counted for the publish rate."""
    groups: Sequence[GroupCounts]
    recent_span: float = 10.0
    """Seconds those entries span: ``RATE_WINDOW``, or less when the window held
    more than ``RATE_SAMPLE`` and only the newest were read."""
    server_time: float | None = None
    """The server's clock when the partition was read (seconds), if known."""


@dataclasses.dataclass(frozen=True, slots=True)
class TopicReport:
    """A topic's size, memory, publish rate and retention losses."""

    topic: str
    partitions: int
    length: int
    """Entries in all partitions (acknowledged or not, until trimmed)."""
    lengths: tuple[int, ...]
    """Entries per partition."""
    memory_bytes: int | None
    """What the partitions' streams take in Redis (``MEMORY USAGE``), when known."""
    publish_rate: float
    """Messages per second over the last ``RATE_WINDOW`` (10) seconds, by entry ids
    (above 100/s per partition, over the time its newest 1,000 entries span)."""
    dropped_unacked: int
    """Unacknowledged messages that retention dropped (``drop_unacked=True``), ever."""
    retention: Retention | None


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionReport:
    """One subscription on one partition."""

    partition: int
    backlog: int
    """Entries not yet delivered."""
    pending: int
    """Delivered, not yet acknowledged."""
    oldest_unacked_age: float | None
    """Seconds since the oldest unacknowledged entry was published (None: none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionReport:
    """A subscription's backlog, stuck messages and dead letters."""

    subscription: str
    topic: str
    backlog: int
    """Published and not yet delivered, over all partitions."""
    pending: int
    """Delivered and not yet acknowledged, over all partitions."""
    oldest_unacked_age: float | None
    """Seconds since the oldest unacknowledged message was published (None: none)."""
    partitions: tuple[PartitionReport, ...]
    pending_per_consumer: Mapping[str, int]
    delivery_attempts: Mapping[int, int]
    """Delivery count -> pending messages with it, over a sample of the
    ``ATTEMPT_SAMPLE`` (1000) oldest pending entries per partition."""
    dead_letter_topic_length: int | None
    """Entries in the subscription's dead-letter topic, or None without one. It
    is the topic's length: it includes the dead letters of any other
    subscription that uses the same dead-letter topic (``list_dead_letters``
    reads this subscription's own)."""

    @property
    def dead_letters(self) -> int | None:
        """Deprecated name of :attr:`dead_letter_topic_length` (it always was the
        topic's length, not this subscription's dead letters); removed in 0.3."""
        return self.dead_letter_topic_length


@dataclasses.dataclass(frozen=True, slots=True)
class Stats:
    """Topics and subscriptions as read at ``taken``."""

    taken: datetime.datetime
    topics: tuple[TopicReport, ...]
    subscriptions: tuple[SubscriptionReport, ...]


def topic_report(
    topic: str,
    counts: Sequence[PartitionCounts],
    *,
    dropped_unacked: int,
    retention: Retention | None,
) -> TopicReport:
    """Sum a topic's partitions."""
    memory = [c.memory for c in counts]
    return TopicReport(
        topic=topic,
        partitions=len(counts),
        length=sum(c.length for c in counts),
        lengths=tuple(c.length for c in counts),
        memory_bytes=None if None in memory else sum(m for m in memory if m is not None),
        publish_rate=sum(c.recent / (c.recent_span or RATE_WINDOW) for c in counts),
        dropped_unacked=dropped_unacked,
        retention=retention,
    )


def subscription_report(
    subscription: str,
    topic: str,
    counts: Sequence[PartitionCounts],
    *,
    now: float,
    dead_letter_topic_length: int | None,
) -> SubscriptionReport:
    """Sum one subscription over its topic's partitions, ages as of ``now`` (seconds)."""
    partitions: list[PartitionReport] = []
    consumers: Counter[str] = Counter()
    attempts: Counter[int] = Counter()
    for c in counts:
        group = next((g for g in c.groups if g.name == subscription), None)
        if group is None:
            continue
        oldest = [i for i in (group.first_pending_id, group.first_undelivered_id) if i]
        age = None
        if oldest:
            age = max(0.0, now - min(id_ms(i) for i in oldest) / 1000)
        partitions.append(PartitionReport(c.partition, group.backlog, group.pending, age))
        consumers.update(group.consumers)
        attempts.update(group.attempts)
    ages = [p.oldest_unacked_age for p in partitions if p.oldest_unacked_age is not None]
    return SubscriptionReport(
        subscription=subscription,
        topic=topic,
        backlog=sum(p.backlog for p in partitions),
        pending=sum(p.pending for p in partitions),
        oldest_unacked_age=max(ages) if ages else None,
        partitions=tuple(partitions),
        pending_per_consumer=dict(sorted(consumers.items())),
        delivery_attempts=dict(sorted(attempts.items())),
        dead_letter_topic_length=dead_letter_topic_length,
    )
