"""The backend protocol: every storage step the engine takes, and no more.

Partitions are numbered 0..P-1; an entry id is the backend's id within its
partition (a Redis stream entry id such as ``1711929600000-0``). Every method
raises only streamsub errors: :class:`~streamsub.UnavailableError` when the
server cannot be reached, :class:`~streamsub.BackendError` for anything else
the server refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, NamedTuple, Protocol

from .._core.retention import Retention
from .._core.seek import PartitionPosition, PartitionSeek
from .._core.stats import PartitionCounts
from .._errors import BackendError, StreamsubError

__all__ = [
    "FENCED",
    "PARKED_CONSUMER",
    "Backend",
    "BrokenLinkError",
    "Link",
    "Ownership",
    "OwnedRead",
    "Entry",
    "GroupInfo",
    "LeaseMode",
    "NackItem",
    "PartitionNode",
    "ReclaimState",
    "Reclaimed",
    "ServerInfo",
    "SnapshotRecord",
    "SubscriptionRecord",
    "TopicRecord",
]


FENCED = "fenced"
"""The cursor :meth:`Backend.reclaim` returns for a partition fenced by a newer
owner."""

PARKED_CONSUMER = "streamsub.delayed"
"""The consumer name delayed nacks wait under (see nack.lua): not for subscribers."""


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    """Where a write to one partition sits in its writer's sequence of writes.

    A publisher pipelines several writes; Redis runs them in order, but a write
    answered with an error (out of memory, read-only) does not stop the ones
    sent behind it. A write linked ``after`` an earlier one runs only if that
    one was stored, so a failed write is never overtaken by a later message of
    its ordering key.
    """

    writer: str
    """The writer's id (one per publisher), unique among live publishers."""
    number: int
    """This write's number, larger than the writer's earlier ones."""
    after: int | None
    """The number of the writer's write to this partition that must be stored
    first, or ``None``: that write is settled (nothing of the writer's is in
    flight before this one)."""


class BrokenLinkError(BackendError):
    """A partition's write was not done: the write it was linked after (see
    :class:`Link`) was not stored. Internal: the publisher reports the earlier
    write's failure instead."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ownership:
    """One member's partitions of an ordered subscription, after a heartbeat."""

    owned: dict[int, int]
    """Partition -> fencing token (larger for each new owner of the partition)."""
    hand_back: frozenset[int]
    """Owned partitions that are another member's by right now: stop reading
    them, let their messages finish, then release them."""
    members: int
    """Live members of the subscription."""
    waiting: int
    """Partitions that are this member's by right but still held by another."""
    fenced: bool = False
    """Another subscriber took this member's name over (see ``instance`` in
    :meth:`Backend.own_partitions`): this one owns nothing and must stop."""


@dataclasses.dataclass(frozen=True, slots=True)
class OwnedRead:
    """What a read of owned partitions (:meth:`Backend.read_owned`) brought."""

    entries: list[Entry]
    fenced: frozenset[int] = frozenset()
    """Partitions not read: their fence holds another owner's token."""


@dataclasses.dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic as stored."""

    name: str
    partitions: int
    layout: str
    created: float
    retention: Retention | None = None
    salts: tuple[int, ...] = ()
    """Per partition, the salt of its keys' hash tag where the backend chose
    them (Redis Cluster: so that partitions spread evenly over the masters);
    empty: the layout's plain tags."""


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionNode:
    """Which server holds a topic's partition now."""

    partition: int
    address: str
    """The server's ``host:port`` (on Redis Cluster: the master that serves
    the partition's slot), or its unix socket's path."""
    node_id: str | None = None
    """The Redis Cluster node id of that master (40 hex digits); None on one server."""


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionRecord:
    """A subscription as stored: its topic and its settings as plain values."""

    name: str
    topic: str
    created: float
    settings: Mapping[str, object]


class NackItem(NamedTuple):
    """One entry to give back: after ``delay_ms``, as delivery ``attempt``."""

    entry_id: str
    delay_ms: int
    delivered_ms: int
    """When this delivery was handed over (ms since the epoch), for dead letters."""
    attempt: int
    handled: bool
    """False when no handler saw it: its delivery count is taken back."""


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


@dataclasses.dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the server is and how it is set up, as far as streamsub cares."""

    version: tuple[int, int, int]
    maxmemory_policy: str | None
    """None when the server does not say."""

    @property
    def acked_trim(self) -> bool:
        """The server trims only acknowledged entries itself (``XTRIM … ACKED``, 8.2+)."""
        return self.version >= (8, 2, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A snapshot as stored: a subscription's position and pending ids per partition."""

    name: str
    subscription: str
    topic: str
    created: float
    positions: Mapping[int, PartitionPosition]
    expires: float


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
        """Per-partition counts of ``group``, every partition; raises
        :class:`SubscriptionNotFoundError` when a partition has no such group."""
        ...

    # --- data ------------------------------------------------------------------
    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        """Append each partition's messages in order; return, per partition, their
        ids or why that partition's write failed: not done (nothing of it
        stored), or stored but not confirmed as the backend's durability asks
        (:class:`~streamsub.UnavailableError`; judged per node: on a cluster, a node whose
        replicas fell short fails only the partitions it stored).

        Each partition's messages come packed and concatenated (``Encoded.packed``).
        A partition with a :class:`Link` is written only if the link holds, else it
        answers :class:`BrokenLinkError`. Writes of one backend run in call order.
        Raises (rather than answers) when the outcome is unknown, as on a broken
        connection: then each partition's write may or may not be stored.
        """
        ...

    def write_groups(
        self, topic: TopicRecord, partitions: Iterable[int]
    ) -> dict[str | None, list[int]] | None:
        """``partitions`` by the server that holds each, as far as the backend
        knows without asking (None: not known), for a write that spans them to
        go as one :meth:`append` per server, each answered when its server
        answers; None when there is one server."""
        ...

    async def read(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partitions: Sequence[int],
        count: int,
        block_ms: int | None,
    ) -> list[Entry]:
        """Deliver up to ``count`` new entries per partition to ``consumer``, waiting up
        to ``block_ms`` for one to arrive (None: answer at once)."""
        ...

    async def fence(self, topic: TopicRecord, group: str, tokens: Mapping[int, int]) -> set[int]:
        """A new owner's first step in partitions of an ordered subscription: from
        now on Redis serves reads of each only under its fencing token (see
        :meth:`read_owned`). Returns the partitions whose fence holds a larger
        token already: a newer owner's, so this one must not read them."""
        ...

    async def read_owned(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        tokens: Mapping[int, int],
        count: int,
        block_ms: int | None,
    ) -> OwnedRead:
        """As :meth:`read`, for an owner of an ordered subscription's partitions
        (partition -> its fencing token): a partition is read only while its
        fence holds the token, atomically at the server, so that a read arriving
        after the partition moved on takes nothing."""
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
        items: Mapping[int, Sequence[NackItem]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        """Give back entries ``consumer`` still owns in the delivery named by each
        item's ``attempt``: each is reclaimable ``delay_ms`` after now, by
        reclaimers whose min-idle is ``min_idle_ms``. One not ``handled`` (no
        handler saw it) has its delivery count taken back. An entry owned by
        another consumer, or redelivered since, is left alone. Return the ids
        given back."""
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
        *,
        take_parked: bool = False,
        tokens: Mapping[int, int] | None = None,
    ) -> tuple[list[Reclaimed], dict[int, str]]:
        """Claim up to ``count`` entries per partition idle >= ``min_idle_ms``,
        scanning from each cursor (``"-"`` starts a sweep); return them and the next
        cursors (``"0-0"`` = done). Entries delivered ``max_attempts`` times (0 = no
        limit) come back exhausted, held but not counted as delivered again.
        Entries in ``skip`` (still in this consumer's hands) are left alone.
        Nacked entries whose backoff runs are left alone too, unless
        ``take_parked`` (a new owner of an ordered partition takes everything).
        With ``tokens`` (an owner of ordered partitions: partition -> fencing
        token), a partition whose fence holds another token is not swept: its
        cursor comes back :data:`FENCED`."""
        ...

    async def ack_owned(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        ids: Mapping[int, Sequence[tuple[str, int]]],
    ) -> dict[int, list[str]]:
        """Acknowledge (entry id, delivery attempt) pairs only where ``consumer``
        still owns that delivery; return the ids acknowledged."""
        ...

    async def dead_letter(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partition: int,
        entry_id: str,
        target: TopicRecord,
        target_partition: int,
        packed: bytes,
        first_delivery_ms: int | None,
        last_delivery_ms: int | None,
    ) -> str | None:
        """Append ``packed`` (plus its delivery times) to ``target`` and acknowledge
        the source entry, only while ``consumer`` owns it; return the dead letter's
        message id, or None when the entry was not ``consumer``'s (already moved,
        acknowledged, or taken by another): then nothing is written. Never loses
        the message: where the two cannot be one step, append comes first."""
        ...

    async def delete_idle_consumers(
        self, topic: TopicRecord, group: str, consumer: str, min_idle_ms: int
    ) -> list[str]:
        """Delete consumers other than ``consumer`` with no pending entries, idle
        for ``min_idle_ms``."""
        ...

    async def own_partitions(
        self,
        topic: TopicRecord,
        group: str,
        member: str,
        lease_ms: int,
        *,
        release: Sequence[int] = (),
        leave: bool = False,
        take: bool = True,
        instance: str = "",
        claim: bool = False,
    ) -> Ownership:
        """Heartbeat of ``member`` of ordered subscription ``group``: extend its
        membership and the partitions it owns, take those that are its by right
        and free (unless not ``take``), release ``release`` (all, and the
        membership, when ``leave``).

        ``instance`` tells apart subscribers that use one member name: the one
        that heartbeats with ``claim`` (its first heartbeat) takes the name over,
        with what it owns under new fencing tokens, as Kafka's static members
        do; the other is answered ``fenced`` from then on, and nothing of its
        heartbeat is done."""
        ...

    async def partition_owners(self, group: str) -> dict[int, tuple[str, int]]:
        """The live owners of an ordered subscription's partitions: partition ->
        (member, fencing token)."""
        ...

    async def pending_owners(
        self, topic: TopicRecord, group: str, ids: Mapping[int, Sequence[str]]
    ) -> dict[tuple[int, str], str | None]:
        """Per (partition, id): the consumer whose pending list holds the entry, or
        None when it is pending nowhere (acknowledged, or trimmed)."""
        ...

    async def locate_partitions(self, topic: TopicRecord) -> list[PartitionNode]:
        """Per partition, in order, the server that holds it now."""
        ...

    # --- operations: retention --------------------------------------------------
    # (Appended for the operator's tools; the data-path methods above are the
    # receiver's.)
    async def server_info(self) -> ServerInfo:
        """The server's version and memory policy."""
        ...

    async def server_time(self) -> float:
        """The server's clock, seconds since the epoch (``TIME``): what retention,
        snapshot expiry and statistics judge ages by, whatever the client's clock."""
        ...

    async def set_retention(self, topic: TopicRecord, retention: Retention | None) -> None:
        """Store ``retention`` as the topic's policy (None: keep everything)."""

    async def trim(
        self,
        topic: TopicRecord,
        partition: int,
        *,
        max_age: float | None,
        max_length: int | None,
        drop_unacked: bool,
        batch: int,
        acked_trim: bool,
        floor: str | None = None,
        dead_letters: bool = False,
    ) -> tuple[int, int, bool]:
        """Delete up to ``batch`` of the partition's oldest entries that are older
        than ``max_age`` seconds by the server's clock or beyond ``max_length``,
        and, unless ``drop_unacked``, below the partition's safe point and the
        live snapshot holds, both read in the same atomic step, and below
        ``floor`` (what snapshot records still need; None: nothing). Return
        (deleted, of them unacknowledged, more remain). With ``drop_unacked`` the
        unacknowledged ones are added to the partition's dropped counter and
        leave the pending lists; with ``dead_letters`` (a dead-letter topic)
        entries deleted while no group reads the topic are counted there too.
        ``acked_trim`` lets a server that has ``XTRIM … ACKED`` decide what is
        acknowledged itself."""
        ...

    async def dropped_unacked(self, topic: TopicRecord) -> dict[int, int]:
        """Per partition, how many unacknowledged entries retention has dropped."""
        ...

    async def try_lock(self, name: str, token: str, ttl: float) -> bool:
        """Take the lock ``name`` for ``ttl`` seconds unless someone holds it."""
        ...

    async def extend_lock(self, name: str, token: str, ttl: float) -> bool:
        """Give the lock ``name`` ``ttl`` more seconds if ``token`` still holds it;
        False when it does not (the lock expired or another holder took it)."""
        ...

    async def unlock(self, name: str, token: str) -> None:
        """Give back the lock ``name`` if ``token`` still holds it."""

    # --- operations: seek and snapshots ----------------------------------------
    async def seek_partition(
        self, topic: TopicRecord, group: str, partition: int, plan: PartitionSeek, consumer: str
    ) -> tuple[int, int]:
        """Apply one partition's seek in one atomic step: move the group, acknowledge
        pending entries at or below the new position but for ``plan.redeliver``,
        which are made pending again to ``consumer`` and reclaimable at once.
        On an ordered subscription, a partition where entries were made pending
        again passes to a new owner, which takes them over before it reads the
        entries after the position. Return (acknowledged, made pending again)."""
        ...

    async def hold_positions(
        self, topic: TopicRecord, group: str, name: str, lifetime: float, max_pending: int
    ) -> tuple[dict[int, PartitionPosition], float, float]:
        """Read ``group``'s last delivered id and pending ids on every partition
        and, in the same atomic step per partition, hold back retention there
        for snapshot ``name`` for ``lifetime`` seconds of the server's clock.
        Return the positions, and when (server time) the hold began and ends.
        Raises AlreadyExistsError (a live snapshot of that name),
        FailedPreconditionError (more than ``max_pending`` pending on a
        partition) or SubscriptionNotFoundError, and then holds nothing."""
        ...

    async def release_holds(
        self, topic: TopicRecord, name: str, partitions: Sequence[int] | None = None
    ) -> None:
        """Drop snapshot ``name``'s retention holds (on ``partitions``, or all)."""

    async def create_snapshot(self, record: SnapshotRecord) -> bool:
        """Store ``record`` unless a snapshot of that name exists; return whether stored."""
        ...

    async def get_snapshot(self, name: str) -> SnapshotRecord | None:
        """The stored snapshot, or None."""
        ...

    async def list_snapshots(self) -> list[SnapshotRecord]:
        """Every snapshot, sorted by name."""
        ...

    async def delete_snapshot(self, name: str) -> bool:
        """Delete a snapshot; return whether there was one."""
        ...

    # --- operations: reading and deleting entries (dead-letter tools) ----------
    async def read_range(
        self, topic: TopicRecord, partition: int, after: str, count: int
    ) -> list[tuple[str, Sequence[bytes]]]:
        """Up to ``count`` entries of a partition after id ``after`` (``"0-0"``: from the
        start), oldest first, as (entry id, flat fields), without delivering them."""
        ...

    async def delete_entries(self, topic: TopicRecord, ids: Mapping[int, Sequence[str]]) -> int:
        """Delete entries, acknowledging them in every group of their partition first;
        return how many existed."""
        ...

    async def claim_entries(
        self, topic: TopicRecord, ids: Mapping[int, Sequence[str]], ttl: float
    ) -> dict[int, list[str]]:
        """Per partition, claim ``ids`` for ``ttl`` seconds (server clock) in one
        atomic step and return those won: entries that exist and that nobody
        holds a live claim on. Deleting an entry ends its claim."""
        ...

    # --- operations: statistics --------------------------------------------------
    async def partition_counts(
        self,
        topic: TopicRecord,
        *,
        window: float,
        rate_sample: int,
        sample: int,
        backlog_cap: int,
    ) -> list[PartitionCounts]:
        """Every partition's length, memory, the entries of the last ``window``
        seconds by the server's clock (at most the newest ``rate_sample``, and
        the time they span) and, per group, its pending and backlog (counted up
        to ``backlog_cap`` when the server has no lag) counts, first
        unacknowledged ids, pending per consumer and the delivery counts of up
        to ``sample`` oldest pending entries. Bounded work per partition,
        whatever its length."""
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
