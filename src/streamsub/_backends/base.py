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
from typing import Literal, NamedTuple, Protocol

__all__ = [
    "Backend",
    "Entry",
    "GroupInfo",
    "LeaseMode",
    "ReclaimState",
    "Reclaimed",
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


class Entry(NamedTuple):
    """One delivered entry: its flat field list undecoded, and its delivery count."""

    partition: int
    entry_id: str
    fields: Sequence[bytes]
    delivery_count: int


ReclaimState = Literal["deliver", "exhausted", "lost"]
LeaseMode = Literal["set", "extend", "end"]
"""How ``Backend.lease_deliveries`` treats an entry's idle time (the gateway's)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reclaimed:
    """An entry the reclaimer took: deliver it, dead-letter it, or count it lost."""

    entry: Entry
    state: ReclaimState
    first_delivery_ms: int
    last_delivery_ms: int


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

    async def ack(
        self,
        topic: TopicRecord,
        group: str,
        ids: Mapping[int, Sequence[str]],
        forget: Mapping[int, Sequence[str]] | None = None,
    ) -> int:
        """Acknowledge entries; return how many were pending. ``forget`` names
        redelivered ones whose delivery-time records can go."""
        ...

    async def extend(
        self, topic: TopicRecord, group: str, consumer: str, ids: Mapping[int, Sequence[str]]
    ) -> dict[int, list[str]]:
        """Reset the idle time of entries ``consumer`` still owns, without counting a
        delivery (a lease extension); return the ids it still owns."""
        ...

    async def nack(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        items: Mapping[int, Sequence[tuple[str, int, int, bool]]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        """Give back entries ``consumer`` still owns, as (id, delay ms, delivery time
        ms, delivered): each is reclaimable ``delay`` after now, by reclaimers whose
        min-idle is ``min_idle_ms``. One not ``delivered`` (no handler saw it) has
        its delivery count taken back. Return the ids it still owned."""
        ...

    async def reclaim(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        cursors: Mapping[int, str],
        min_idle_ms: int,
        count: int,
        max_attempts: int,
        skip: Mapping[int, Sequence[str]] | None = None,
    ) -> tuple[list[Reclaimed], dict[int, str]]:
        """Claim up to ``count`` entries per partition idle >= ``min_idle_ms``,
        scanning from each cursor (``"-"`` starts a sweep); return them and the next
        cursors (``"0-0"`` = done). Entries delivered ``max_attempts`` times (0 = no
        limit) come back exhausted, held but not counted as delivered again.
        Entries in ``skip`` (still in this consumer's hands) are left alone."""
        ...

    async def ack_owned(
        self, topic: TopicRecord, group: str, consumer: str, ids: Mapping[int, Sequence[str]]
    ) -> dict[int, list[str]]:
        """Acknowledge only entries ``consumer`` still owns; return those acknowledged."""
        ...

    async def dead_letter(
        self,
        topic: TopicRecord,
        group: str,
        partition: int,
        entry_id: str,
        target: TopicRecord,
        target_partition: int,
        packed: bytes,
        first_delivery_ms: int | None,
        last_delivery_ms: int | None,
    ) -> str:
        """Append ``packed`` (plus its delivery times) to ``target`` and acknowledge
        the source entry; return the dead letter's message id. Never loses the
        message: where the two cannot be one step, append comes first."""
        ...

    async def delete_idle_consumers(
        self, topic: TopicRecord, group: str, consumer: str, min_idle_ms: int
    ) -> list[str]:
        """Delete consumers other than ``consumer`` with no pending entries, idle
        for ``min_idle_ms``."""
        ...

    # --- gateway (streamsub.gateway) ---------------------------------------------
    # Steps the Pub/Sub gateway needs beyond the receiver's: deliveries named by
    # an ack id (entry, consumer, delivery count) that any process can settle,
    # subscription settings rewritten in place, and Pub/Sub labels.
    async def ack_deliveries(
        self,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[tuple[str, str, int]]],
    ) -> dict[int, list[str]]:
        """Acknowledge each (id, consumer, delivery count) only while the pending
        list still shows that consumer and that count; return the ids acknowledged."""
        ...

    async def lease_deliveries(
        self,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[tuple[str, str, int, int, LeaseMode]]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        """Set the idle time (ms) of each (id, consumer, delivery count, idle ms,
        mode) only while the pending list still shows that consumer and that count,
        without counting a delivery; return the ids whose idle time was set.
        ``"set"`` sets it; ``"extend"`` resets it to 0 only while it is below
        ``min_idle_ms`` (the lease runs); ``"end"`` raises it to the given value,
        never lowers it."""
        ...

    async def update_subscription(self, record: SubscriptionRecord) -> bool:
        """Rewrite a stored subscription's settings; False when it no longer exists."""
        ...

    async def get_labels(self, kind: Literal["topic", "subscription"], name: str) -> dict[str, str]:
        """The labels stored for a topic or subscription (empty when none)."""
        ...

    async def set_labels(
        self, kind: Literal["topic", "subscription"], name: str, labels: Mapping[str, str]
    ) -> None:
        """Replace the labels of a topic or subscription (empty deletes them)."""
