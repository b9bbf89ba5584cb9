"""The backend protocol: every storage step the engine takes, and no more.

Partitions are numbered 0..P-1; an entry id is the backend's id within its
partition (a Redis stream entry id such as ``1711929600000-0``). Every method
raises only streamsub errors: :class:`~streamsub.UnavailableError` when the
server cannot be reached, :class:`~streamsub.BackendError` for anything else
the server refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = [
    "Backend",
    "Entry",
    "GroupInfo",
    "PendingEntry",
    "SubscriptionRecord",
    "TopicRecord",
]


@dataclasses.dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic as stored."""

    name: str
    partitions: int
    layout: str
    created: float


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionRecord:
    """A subscription as stored: its topic and its settings as plain values."""

    name: str
    topic: str
    created: float
    settings: Mapping[str, object]


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One delivered entry: its fields undecoded, and its delivery count."""

    partition: int
    entry_id: str
    fields: Mapping[bytes, bytes]
    delivery_count: int


@dataclasses.dataclass(frozen=True, slots=True)
class PendingEntry:
    """An entry in a group's pending list."""

    partition: int
    entry_id: str
    consumer: str
    idle_ms: int
    delivery_count: int


@dataclasses.dataclass(frozen=True, slots=True)
class GroupInfo:
    """One partition's view of a subscription."""

    partition: int
    length: int
    pending: int
    last_delivered_id: str
    lag: int | None
    consumers: int


class Backend(Protocol):
    """What the engine needs from storage."""

    @property
    def url(self) -> str:
        """Where the backend is, for messages (password removed)."""
        ...

    async def ping(self) -> None:
        """Check that the server answers."""

    async def close(self) -> None:
        """Close every connection."""

    # --- admin -----------------------------------------------------------------
    async def create_topic(self, record: TopicRecord) -> TopicRecord:
        """Store ``record`` unless the topic exists; return the stored record."""
        ...

    async def get_topic(self, name: str) -> TopicRecord | None:
        """The stored topic, or None."""
        ...

    async def list_topics(self) -> list[TopicRecord]:
        """Every topic, sorted by name."""
        ...

    async def delete_topic(self, record: TopicRecord) -> None:
        """Delete the topic's streams and its record."""

    async def create_subscription(
        self, record: SubscriptionRecord, topic: TopicRecord, start_id: str
    ) -> SubscriptionRecord:
        """Create the group on every partition and store ``record`` unless one exists."""
        ...

    async def get_subscription(self, name: str) -> SubscriptionRecord | None:
        """The stored subscription, or None."""
        ...

    async def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionRecord]:
        """Every subscription (of ``topic``), sorted by name."""
        ...

    async def delete_subscription(self, record: SubscriptionRecord, topic: TopicRecord) -> None:
        """Destroy the group on every partition and delete the record."""

    async def group_info(self, topic: TopicRecord, group: str) -> list[GroupInfo]:
        """Per-partition counts of ``group``."""
        ...

    # --- data ------------------------------------------------------------------
    async def append(self, topic: TopicRecord, batch: Mapping[int, bytes]) -> dict[int, list[str]]:
        """Append each partition's messages in order; return their ids.

        Each partition's messages come packed and concatenated (``Encoded.packed``).
        """
        ...

    async def read(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partitions: Sequence[int],
        count: int,
        block_ms: int,
    ) -> list[Entry]:
        """Deliver up to ``count`` new entries per partition to ``consumer``."""
        ...

    async def ack(self, topic: TopicRecord, group: str, ids: Mapping[int, Sequence[str]]) -> int:
        """Acknowledge entries; return how many were pending."""
        ...

    async def set_idle(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        ids: Mapping[int, Sequence[str]],
        idle_ms: int,
    ) -> dict[int, list[str]]:
        """Set the idle time of entries ``consumer`` still owns (0 extends a lease,
        the ack deadline releases it); return the ids it still owns."""
        ...

    async def reclaim(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        cursors: Mapping[int, str],
        min_idle_ms: int,
        count: int,
    ) -> tuple[list[Entry], dict[int, str], dict[int, list[str]]]:
        """Claim up to ``count`` entries per partition idle >= ``min_idle_ms``,
        scanning from each cursor; return the entries (with exact delivery
        counts), the next cursors, and per partition the ids that were pending
        but had been trimmed (lost)."""
        ...
