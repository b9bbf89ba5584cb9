"""The gateway's one door to the data path: deliveries named by ack ids.

Every call the gateway makes to the backend's data methods (read, nack,
reclaim, dead_letter, and the gateway's own ack_deliveries/lease_deliveries)
is in this module, so a change of their signatures is adapted here alone.

A Pub/Sub ack id names one delivery: ``<partition>/<entry id>/<delivery
count>/<consumer>``. Acking or extending one is checked on the server against
the pending list (still that consumer, still that delivery count), so any
connection and any gateway process can settle it, and an ack from a delivery
whose lease lapsed and went to someone else settles nothing.

Leases: the subscription's ack deadline ``D`` is the reclaimers' min-idle, so a
lease that should end ``r <= D`` seconds from now is an idle time of ``D - r``;
longer leases are held by re-setting the idle time to 0 every ``D/3`` until
they are within ``D`` of their end. One lease table per subscription and
process does that, whichever stream delivered the message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from .. import metrics
from .._backends.base import (
    FENCED,
    Backend,
    Entry,
    LeaseMode,
    NackItem,
    Reclaimed,
    SubscriptionRecord,
    TopicRecord,
)
from .._core.codec import UndecodableEntry, decode
from .._core.deadletter import UNDECODABLE, dead_letter_message
from .._core.partition import partition_for_key
from .._core.retry import backoff
from .._engine._retrying import raise_if_cancelled
from .._errors import StreamsubError, SubscriptionNotFoundError, TopicNotFoundError
from .._settings import Limits, RetryPolicy
from ._ownership import OWNERSHIP_LEASE, Membership
from ._tasks import end_task

__all__ = [
    "Adapter",
    "Puller",
    "Received",
    "SubscriptionView",
    "format_ack_id",
    "parse_ack_id",
]

log = logging.getLogger("streamsub.gateway")

_Key = tuple[int, str]
_VIEW_TTL = 1.0
"""Seconds a subscription's settings are cached: updates show within a second."""
_LEASE_TICK = (0.05, 2.0)
"""Bounds of the lease table's period (a quarter of the ack deadline)."""
_RECLAIM_EVERY = (0.05, 5.0)
"""Bounds of the period between reclaim sweeps (a quarter of the ack deadline)."""
_ASSUMED_SIZE = float(Limits().max_message_bytes)
"""Bytes per message assumed for the byte limit until sizes have been seen: the
largest a message may be, so that the first read never overshoots the limit."""
_CONSUMER_EXPIRY = 3600.0
"""A consumer (one per stream) idle this long and holding nothing is deleted."""
_CONSUMER_SWEEP_EVERY = 600.0
_DRY_BLOCK_MS = 100
"""How long a read of some partitions waits after a round over all found nothing."""
_HOUSEKEEPING_EVERY = 1.0
_UNARY_IDLE = 60.0
"""Seconds without a Pull after which an ordered subscription's unary puller closes
(so that a gateway that served a Pull once does not keep partitions for ever)."""
_MEMBERSHIP_LINGER = 2.0
"""Seconds an ordered subscription nothing here reads or holds stays owned (a
client that reopens its stream at once finds its partitions still here)."""


def format_ack_id(partition: int, entry_id: str, attempt: int, consumer: str) -> str:
    """The ack id of one delivery."""
    return f"{partition}/{entry_id}/{attempt}/{consumer}"


def parse_ack_id(ack_id: str) -> tuple[int, str, int, str] | None:
    """(partition, entry id, delivery count, consumer), or None if malformed."""
    parts = ack_id.split("/", 3)
    if len(parts) != 4 or not parts[3]:
        return None
    try:
        partition, attempt = int(parts[0]), int(parts[2])
    except ValueError:
        return None
    if partition < 0 or attempt < 1 or "-" not in parts[1]:
        return None
    return partition, parts[1], attempt, parts[3]


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionView:
    """What the data path needs of a subscription, read from its record."""

    record: SubscriptionRecord
    topic: TopicRecord
    dead_letter_topic: TopicRecord | None
    ack_deadline: float
    max_delivery_attempts: int
    retry_policy: RetryPolicy | None
    exactly_once: bool
    ordering: bool

    @property
    def name(self) -> str:
        """The streamsub subscription (consumer group) name."""
        return self.record.name


@dataclasses.dataclass(frozen=True, slots=True)
class Received:
    """One delivery as the faces render it."""

    ack_id: str
    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str | None
    publish_ms: int
    delivery_attempt: int


@dataclasses.dataclass(slots=True, eq=False)
class _Delivery:
    partition: int
    entry_id: str
    attempt: int
    consumer: str
    size: int
    delivered_ms: int
    lease_end: float
    set_at: float
    final: bool
    """The idle time now encodes the lease end exactly; nothing more to extend."""
    owner: Puller | None


class Adapter:
    """Deliveries, leases and settlement for every subscription of one gateway."""

    def __init__(
        self,
        backend: Backend,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        ownership_lease: float = OWNERSHIP_LEASE,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._wall_clock = wall_clock
        self._views: dict[str, tuple[float, SubscriptionView]] = {}
        self._tables: dict[str, _LeaseTable] = {}
        self._prefix = f"gw-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._numbers = itertools.count(1)
        self._pullers: set[Puller] = set()
        self._consumer_sweeps: dict[str, float] = {}
        self._members: dict[str, list[Puller]] = {}
        """Ordered subscription -> its streams here, in the order they came."""
        self._users: dict[str, set[Puller]] = {}
        """Ordered subscription -> its pullers here (streams and unary)."""
        self._memberships: dict[str, Membership] = {}
        self._idle_since: dict[str, float] = {}
        self._ownership_lease = ownership_lease
        self._housekeeping: asyncio.Task[None] | None = None
        self._carried: dict[tuple[str, str], list[_Delivery]] = {}
        """(subscription, client id) -> what a closed stream of that client held."""

    def _mine(self, consumer: str) -> bool:
        """Whether ``consumer`` is one of this process's (its lease table's)."""
        return consumer.startswith(f"{self._prefix}-")

    def new_consumer(self, kind: str) -> str:
        """A consumer name unique to this process (stable parts first, for humans)."""
        return f"{self._prefix}-{kind}{next(self._numbers)}"

    # --- subscriptions ---------------------------------------------------------
    async def view(self, name: str) -> SubscriptionView:
        """The subscription ``name`` (cached for a second); raises
        SubscriptionNotFoundError or TopicNotFoundError."""
        now = self._clock()
        cached = self._views.get(name)
        if cached is not None and now - cached[0] < _VIEW_TTL:
            return cached[1]
        record = await self._backend.get_subscription(name)
        if record is None:
            self._views.pop(name, None)
            raise SubscriptionNotFoundError(name)
        topic = await self._backend.get_topic(record.topic)
        if topic is None:
            raise TopicNotFoundError(record.topic)
        settings = record.settings
        dead_letter_name = settings.get("dead_letter_topic")
        dead_letter = None
        if isinstance(dead_letter_name, str):
            dead_letter = await self._backend.get_topic(dead_letter_name)
        retry = settings.get("retry_policy")
        view = SubscriptionView(
            record=record,
            topic=topic,
            dead_letter_topic=dead_letter,
            ack_deadline=float(settings["ack_deadline"]),  # type: ignore[arg-type]
            max_delivery_attempts=int(settings["max_delivery_attempts"]),  # type: ignore[call-overload]
            retry_policy=RetryPolicy(**retry) if isinstance(retry, dict) else None,
            exactly_once=bool(settings.get("enable_exactly_once_delivery")),
            ordering=bool(settings.get("enable_message_ordering")),
        )
        self._views[name] = (now, view)
        return view

    def forget(self, name: str) -> None:
        """Drop the cached view of ``name`` (after an update or delete)."""
        self._views.pop(name, None)

    async def deleted(self, name: str) -> None:
        """The subscription ``name`` is gone: drop its leases, which settle nothing now."""
        self.forget(name)
        table = self._tables.pop(name, None)
        if table is not None:
            await table.close()
        await self._leave_ownership(name)

    async def sought(self, name: str) -> None:
        """The subscription ``name`` was sought: what this process's streams hold
        of it no longer stands (the seek acknowledged it, or it is delivered
        again), so free their flow-control room and stop extending those
        leases now, and sweep at once for what a snapshot seek made pending."""
        self.forget(name)
        table = self._tables.get(name)
        if table is not None:
            table.clear()
        now = self._clock()
        for puller in self._pullers:
            if puller.view.name == name:
                puller.restart_sweep(now)

    async def rebase(self, name: str) -> None:
        """Re-encode the leases held here of subscription ``name`` against its
        ack deadline now (after an update changed it)."""
        table = self._tables.get(name)
        if table is not None:
            await table.refresh()

    def _table(self, view: SubscriptionView) -> _LeaseTable:
        table = self._tables.get(view.name)
        if table is None:
            table = self._tables[view.name] = _LeaseTable(self, view)
        table.view = view
        return table

    # --- settling --------------------------------------------------------------
    async def acknowledge(self, view: SubscriptionView, ack_ids: Iterable[str]) -> list[str]:
        """Acknowledge deliveries; return the ack ids that settled nothing (malformed,
        already settled, or whose lease went to another delivery)."""
        failed: list[str] = []
        by_partition: dict[int, list[tuple[str, str, int]]] = collections.defaultdict(list)
        named: dict[_Key, list[str]] = collections.defaultdict(list)
        for ack_id in ack_ids:
            parsed = parse_ack_id(ack_id)
            if parsed is None or parsed[0] >= view.topic.partitions:
                failed.append(ack_id)
                continue
            partition, entry_id, attempt, consumer = parsed
            by_partition[partition].append((entry_id, consumer, attempt))
            named[(partition, entry_id)].append(ack_id)
        if not by_partition:
            return failed
        acked = await self._backend.ack_deliveries(view.topic, view.name, by_partition)
        done = {(p, i) for p, ids in acked.items() for i in ids}
        if done:
            metrics.on_acked(view.name, len(done))
        table = self._tables.get(view.name)
        for key, ids in named.items():
            if key in done:
                failed += ids[1:]  # the same delivery acked twice in one call
                if table is not None:
                    table.drop(key)
            else:
                failed += ids
        return failed

    async def modify_deadline(
        self, view: SubscriptionView, ack_ids: Iterable[str], seconds: float
    ) -> list[str]:
        """Set deliveries' leases to end ``seconds`` from now; 0 gives them back
        (a nack: redelivered after the retry policy's backoff). Return the ack
        ids that settled nothing."""
        if seconds <= 0:
            return await self._nack(view, list(ack_ids), backoff_delay=True)
        now = self._clock()
        deadline_ms = int(view.ack_deadline * 1000)
        idle_ms = max(0, deadline_ms - int(seconds * 1000))
        failed: list[str] = []
        by_partition: dict[int, list[tuple[str, str, int, int, LeaseMode]]] = (
            collections.defaultdict(list)
        )
        named: dict[_Key, list[str]] = collections.defaultdict(list)
        for ack_id in ack_ids:
            parsed = parse_ack_id(ack_id)
            if parsed is None or parsed[0] >= view.topic.partitions:
                failed.append(ack_id)
                continue
            partition, entry_id, attempt, consumer = parsed
            by_partition[partition].append((entry_id, consumer, attempt, idle_ms, "set"))
            named[(partition, entry_id)].append(ack_id)
        if not by_partition:
            return failed
        leased = await self._backend.lease_deliveries(
            view.topic, view.name, by_partition, deadline_ms
        )
        done = {(p, i) for p, ids in leased.items() for i in ids}
        table = self._table(view)
        for key, ids in named.items():
            if key in done:
                table.leased(key, now + seconds, now, final=seconds <= view.ack_deadline)
            else:
                failed += ids
                table.drop(key)
        return failed

    async def _nack(
        self, view: SubscriptionView, ack_ids: Sequence[str], *, backoff_delay: bool
    ) -> list[str]:
        failed: list[str] = []
        now_ms = int(self._wall_clock() * 1000)
        table = self._tables.get(view.name)
        # consumer -> partition -> what to give back, as that delivery (attempt)
        items: dict[str, dict[int, list[NackItem]]] = {}
        named: dict[tuple[str, int, str], list[str]] = collections.defaultdict(list)
        for ack_id in ack_ids:
            parsed = parse_ack_id(ack_id)
            if parsed is None or parsed[0] >= view.topic.partitions:
                failed.append(ack_id)
                continue
            partition, entry_id, attempt, consumer = parsed
            delivery = None if table is None else table.get((partition, entry_id))
            delivered_ms = now_ms if delivery is None else delivery.delivered_ms
            delay_ms = int(backoff(view.retry_policy, attempt) * 1000) if backoff_delay else 0
            if not self._mine(consumer):
                # Another process's delivery: its lease table would take back a
                # backoff shorter than the ack deadline (an idle time its next
                # "extend" resets), so park the entry instead (see below).
                delay_ms = max(delay_ms, 1)
            key = (consumer, partition, entry_id)
            if key not in named:
                items.setdefault(consumer, collections.defaultdict(list))[partition].append(
                    NackItem(entry_id, delay_ms, delivered_ms, attempt, True)
                )
            named[key].append(ack_id)
        deadline_ms = int(view.ack_deadline * 1000)
        if items:
            # Redeliver when the backoff ends, not at the next periodic sweep.
            soonest = min(i.delay_ms for p in items.values() for e in p.values() for i in e)
            due = self._clock() + soonest / 1000
            for puller in self._pullers:
                if puller.view.name == view.name:
                    puller.sweep_by(due)
        for consumer, by_partition in items.items():
            # Owner- and attempt-checked: a stale ack id never moves a newer delivery.
            # A delay longer than the min-idle given parks the entry under another
            # consumer until it is due: another process's deliveries are all
            # parked (min-idle 0), so that its lease steps fail, it drops them,
            # and the backoff holds.
            owned = await self._backend.nack(
                view.topic,
                view.name,
                consumer,
                by_partition,
                deadline_ms if self._mine(consumer) else 0,
            )
            done = {(p, i) for p, ids in owned.items() for i in ids}
            if done:
                metrics.on_nacked(view.name, len(done))
            for partition, entries in by_partition.items():
                for entry_id, *_ in entries:
                    ids = named[(consumer, partition, entry_id)]
                    if table is not None:
                        table.drop((partition, entry_id))
                    if (partition, entry_id) in done:
                        failed += ids[1:]
                    else:
                        failed += ids
        return failed

    # --- pulling ---------------------------------------------------------------
    def puller(
        self,
        view: SubscriptionView,
        *,
        consumer: str,
        max_messages: int,
        max_bytes: int,
        deadline: float,
        stream: bool = False,
        client_id: str = "",
    ) -> Puller:
        """A reader of ``view`` for one stream (``stream``) or for unary pulls, as
        ``consumer``. A stream of ``client_id`` starts with what that client's
        earlier streams still hold outstanding (Pub/Sub carries a reconnecting
        client's state over), so they count against its flow control."""
        puller = Puller(
            self,
            view,
            consumer=consumer,
            max_messages=max_messages,
            max_bytes=max_bytes,
            deadline=deadline,
            stream=stream,
            client_id=client_id,
        )
        self._pullers.add(puller)
        if client_id:
            carried = self._carried.pop((view.name, client_id), [])
            table = self._tables.get(view.name)
            if table is not None:
                puller.adopt(d for d in carried if table.get((d.partition, d.entry_id)) is d)
        if view.ordering:
            if stream:
                self._members.setdefault(view.name, []).append(puller)
            self._users.setdefault(view.name, set()).add(puller)
            self._idle_since.pop(view.name, None)
            if view.name not in self._memberships:
                self._memberships[view.name] = Membership(
                    self._backend,
                    view.topic,
                    view.name,
                    self._prefix,
                    busy=functools.partial(self._holds, view.name),
                    clock=self._clock,
                    lease=self._ownership_lease,
                )
                log.info(
                    "streamsub gateway: %s joins the partition ownership of %r",
                    self._prefix,
                    view.name,
                )
            if self._housekeeping is None:
                loop = asyncio.get_running_loop()
                self._housekeeping = loop.create_task(self._keep_memberships())
        return puller

    def carry(self, puller: Puller, outstanding: list[_Delivery]) -> None:
        """Keep what a closing stream of a client held for that client's next
        stream; drop what was carried and settled or lapsed since."""
        for key, deliveries in list(self._carried.items()):
            table = self._tables.get(key[0])
            live = [
                d
                for d in deliveries
                if table is not None and table.get((d.partition, d.entry_id)) is d
            ]
            if live:
                self._carried[key] = live
            else:
                del self._carried[key]
        if outstanding:
            key = (puller.view.name, puller.client_id)
            self._carried.setdefault(key, []).extend(outstanding)

    def _holds(self, name: str, partition: int) -> bool:
        """Whether this process has deliveries of ``partition`` out, or a read or
        sweep of it under way (whose entries are not in the lease table yet)."""
        if any(partition in puller.reading for puller in self._users.get(name, ())):
            return True
        table = self._tables.get(name)
        return table is not None and table.holds(partition)

    def membership(self, name: str) -> Membership | None:
        """This process's membership of ordered subscription ``name``, if any."""
        return self._memberships.get(name)

    async def _keep_memberships(self) -> None:
        """Close unary pullers of ordered subscriptions unused for a while, and
        leave the ownership of subscriptions nothing here reads or holds."""
        while True:
            raise_if_cancelled()  # a stop request swallowed inside a Redis call
            await asyncio.sleep(_HOUSEKEEPING_EVERY)
            now = self._clock()
            for name in list(self._memberships):
                for puller in list(self._users.get(name, ())):
                    if not puller.stream and now - puller.last_pull > _UNARY_IDLE:
                        await puller.close(hand_back=False)
                table = self._tables.get(name)
                if self._users.get(name) or (table is not None and table.holds_any()):
                    self._idle_since.pop(name, None)
                    continue
                since = self._idle_since.setdefault(name, now)
                if now - since >= _MEMBERSHIP_LINGER:
                    await self._leave_ownership(name)

    async def _leave_ownership(self, name: str) -> None:
        self._idle_since.pop(name, None)
        membership = self._memberships.pop(name, None)
        if membership is not None:
            await membership.leave()
            log.info("streamsub gateway: %s left the partition ownership of %r", self._prefix, name)

    def _share(self, puller: Puller) -> list[int]:
        """The owned partitions that are ``puller``'s share here."""
        name = puller.view.name
        membership = self._memberships.get(name)
        if membership is None:
            return []
        members = self._members.get(name) or []
        if puller in members:
            index, count = members.index(puller), len(members)
        elif members:
            return []  # unary pulls of an ordered subscription wait while streams read it
        else:
            index, count = 0, 1
        table = self._tables.get(name)
        busy = set() if table is None else table.partitions_held_elsewhere(puller)
        return [p for p in membership.partitions[index::count] if p not in busy]

    def partitions_for(self, puller: Puller) -> list[int]:
        """The partitions ``puller`` may read and sweep now.

        An ordered subscription's partitions are owned by one gateway process
        at a time (:mod:`._ownership`), and each owned partition is read by one
        puller of that process at a time (the ``i``-th of its ``n`` streams
        here reads every ``n``-th owned partition from the ``i``-th), so one
        ordering key's messages go to one stream, in order; a partition waits
        while another puller's deliveries of it (or a closed stream's, whose
        client may still be handling them) are out, and while it is being
        taken over; unary pulls get partitions only while no stream here reads
        the subscription.
        """
        if not puller.view.ordering:
            return list(range(puller.view.topic.partitions))
        membership = self._memberships.get(puller.view.name)
        taking = {} if membership is None else membership.taking
        return [p for p in self._share(puller) if p not in taking]

    def taking_for(self, puller: Puller) -> list[int]:
        """The partitions of ``puller``'s share being taken over: swept whole first."""
        if not puller.view.ordering:
            return []
        membership = self._memberships.get(puller.view.name)
        if membership is None or not membership.taking:
            return []
        return [p for p in self._share(puller) if p in membership.taking]

    def _leave(self, puller: Puller) -> None:
        self._pullers.discard(puller)
        members = self._members.get(puller.view.name)
        if members is not None and puller in members:
            members.remove(puller)
        users = self._users.get(puller.view.name)
        if users is not None:
            users.discard(puller)
            if not users:
                del self._users[puller.view.name]

    async def delete_idle_consumers(self, view: SubscriptionView) -> None:
        """Delete the group's consumers that hold nothing and were idle for
        ``_CONSUMER_EXPIRY`` (every stream reads as a consumer of its own), at
        most once per ``_CONSUMER_SWEEP_EVERY`` per subscription."""
        now = self._clock()
        if now < self._consumer_sweeps.get(view.name, 0.0):
            return
        self._consumer_sweeps[view.name] = now + _CONSUMER_SWEEP_EVERY
        try:
            deleted = await self._backend.delete_idle_consumers(
                view.topic, view.name, "", int(_CONSUMER_EXPIRY * 1000)
            )
        except StreamsubError as exc:
            log.warning("streamsub gateway: deleting idle consumers failed: %s", exc)
            return
        if deleted:
            log.info("streamsub gateway: deleted %d idle consumers of %r", len(deleted), view.name)

    async def close(self) -> None:
        """Stop every lease table and give back every delivery still leased here,
        so that other gateways deliver them at once; then release the ordered
        subscriptions' partitions (after the leases: their new owners take
        over what was given back, before anything later)."""
        for puller in list(self._pullers):
            puller.closed = True
        if self._housekeeping is not None:
            await end_task(self._housekeeping, "the ordered subscriptions' housekeeping")
            self._housekeeping = None
        tables, self._tables = list(self._tables.values()), {}
        for table in tables:
            await table.close()
            try:
                await self._nack(table.view, table.ack_ids(), backoff_delay=False)
            except StreamsubError as exc:
                log.warning(
                    "streamsub gateway: could not give back the leases of %r (%s); they "
                    "return when their deadlines pass",
                    table.view.name,
                    exc,
                )
        for name in list(self._memberships):
            await self._leave_ownership(name)


class _LeaseTable:
    """Leases of one subscription's deliveries made or extended by this process."""

    def __init__(self, adapter: Adapter, view: SubscriptionView) -> None:
        self._adapter = adapter
        self.view = view
        self._deliveries: dict[_Key, _Delivery] = {}
        self._task: asyncio.Task[None] | None = None
        self._unwatch = metrics.watch_in_flight(view.name, self.__len__)

    def __len__(self) -> int:
        return len(self._deliveries)

    def get(self, key: _Key) -> _Delivery | None:
        return self._deliveries.get(key)

    def holds(self, partition: int) -> bool:
        return any(d.partition == partition for d in self._deliveries.values())

    def holds_any(self) -> bool:
        return bool(self._deliveries)

    def ids_of(self, partitions: Iterable[int]) -> dict[int, list[str]]:
        wanted = set(partitions)
        ids: dict[int, list[str]] = {}
        for partition, entry_id in self._deliveries:
            if partition in wanted:
                ids.setdefault(partition, []).append(entry_id)
        return ids

    def partitions_held_elsewhere(self, puller: Puller) -> set[int]:
        return {d.partition for d in self._deliveries.values() if d.owner is not puller}

    def ack_ids(self) -> list[str]:
        return [
            format_ack_id(d.partition, d.entry_id, d.attempt, d.consumer)
            for d in self._deliveries.values()
        ]

    def add(self, delivery: _Delivery) -> None:
        key = (delivery.partition, delivery.entry_id)
        old = self._deliveries.get(key)
        if old is not None and old.owner is not None and old is not delivery:
            old.owner.released(old)
        self._deliveries[key] = delivery
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def leased(self, key: _Key, lease_end: float, now: float, *, final: bool) -> None:
        delivery = self._deliveries.get(key)
        if delivery is not None:
            delivery.lease_end, delivery.set_at, delivery.final = lease_end, now, final

    def clear(self) -> None:
        for key in list(self._deliveries):
            self.drop(key)

    def drop(self, key: _Key) -> None:
        delivery = self._deliveries.pop(key, None)
        if delivery is not None and delivery.owner is not None:
            delivery.owner.released(delivery)

    async def close(self) -> None:
        self._unwatch()
        if self._task is not None:
            await end_task(self._task, f"the lease table of {self.view.name!r}")
            self._task = None

    async def refresh(self) -> None:
        """Take up the subscription's ack deadline now. Leases are idle times
        relative to it (see the module's docstring), so after a change every
        lease held here is set again against the new one: a lowered deadline
        would otherwise end leases already granted."""
        try:
            view = await self._adapter.view(self.view.name)
        except (SubscriptionNotFoundError, TopicNotFoundError):
            return  # deleted: the leases settle nothing any more
        old, self.view = self.view.ack_deadline, view
        if view.ack_deadline == old or not self._deliveries:
            return
        now = self._adapter._clock()
        deadline = view.ack_deadline
        deadline_ms = int(deadline * 1000)
        updates: dict[int, list[tuple[str, str, int, int, LeaseMode]]] = collections.defaultdict(
            list
        )
        sent = list(self._deliveries.values())
        for d in sent:
            remaining = max(0.0, d.lease_end - now)
            d.final = remaining <= deadline
            d.set_at = now
            idle_ms = deadline_ms - int(remaining * 1000) if d.final else 0
            updates[d.partition].append((d.entry_id, d.consumer, d.attempt, idle_ms, "set"))
        leased = await self._adapter._backend.lease_deliveries(
            self.view.topic, self.view.name, updates, deadline_ms
        )
        done = {(p, i) for p, ids in leased.items() for i in ids}
        for d in sent:
            key = (d.partition, d.entry_id)
            if key not in done and self._deliveries.get(key) is d:
                self.drop(key)

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()  # a stop request swallowed inside a Redis call
            deadline = self.view.ack_deadline
            await asyncio.sleep(min(max(deadline / 4, _LEASE_TICK[0]), _LEASE_TICK[1]))
            try:
                # An update made through another gateway shows here within
                # the view cache's second.
                await self.refresh()
                deadline = self.view.ack_deadline
                await self._tick(deadline)
            except StreamsubError as exc:
                log.warning(
                    "streamsub gateway: extending leases of %r failed: %s", self.view.name, exc
                )

    async def _tick(self, deadline: float) -> None:
        now = self._adapter._clock()
        deadline_ms = int(deadline * 1000)
        updates: dict[int, list[tuple[str, str, int, int, LeaseMode]]] = collections.defaultdict(
            list
        )
        sent: list[_Delivery] = []
        for key, d in list(self._deliveries.items()):
            remaining = d.lease_end - now
            if d.final:
                if remaining <= 0:  # lapsed: the reclaimers may take it now
                    self.drop(key)
                continue
            mode: LeaseMode
            if remaining <= deadline:
                idle_ms = min(deadline_ms, max(0, deadline_ms - int(remaining * 1000)))
                d.final, mode = True, "end"
            elif now - d.set_at >= deadline / 3:
                idle_ms, mode = 0, "extend"
            else:
                continue
            d.set_at = now
            updates[d.partition].append((d.entry_id, d.consumer, d.attempt, idle_ms, mode))
            sent.append(d)
        if not sent:
            return
        leased = await self._adapter._backend.lease_deliveries(
            self.view.topic, self.view.name, updates, deadline_ms
        )
        done = {(p, i) for p, ids in leased.items() for i in ids}
        for d in sent:
            key = (d.partition, d.entry_id)
            if key not in done and self._deliveries.get(key) is d:
                self.drop(key)  # acked elsewhere, or taken by another delivery


class Puller:
    """Reads one subscription for one consumer within flow-control limits."""

    def __init__(
        self,
        adapter: Adapter,
        view: SubscriptionView,
        *,
        consumer: str,
        max_messages: int,
        max_bytes: int,
        deadline: float,
        stream: bool,
        client_id: str = "",
    ) -> None:
        self._adapter = adapter
        self.client_id = client_id
        self.view = view
        self.stream = stream
        self.last_pull = adapter._clock()
        self._in_transit: collections.Counter[int] = collections.Counter()
        self.consumer = consumer
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.closed = False
        self._outstanding: dict[_Key, _Delivery] = {}
        self._bytes = 0
        self._average_size: float | None = None
        self.room = asyncio.Event()
        self._cursors: dict[int, str] = {}
        self._next_sweep = 0.0
        self._next_partition = 0
        self.delivered = 0
        self.redelivered = 0
        self.dead_lettered = 0

    @property
    def reading(self) -> frozenset[int]:
        """Partitions whose entries are on their way to this puller: a read or sweep
        of them is at the server, or what it brought is not all in the lease
        table yet (an ordered partition is not handed over meanwhile: its new
        owner would take those entries over too, and deliver them again)."""
        return frozenset(p for p, n in self._in_transit.items() if n > 0)

    @contextlib.contextmanager
    def _transit(self, partitions: Iterable[int]) -> Iterator[None]:
        """Count ``partitions`` in :attr:`reading` for the block."""
        counted = list(set(partitions))
        self._in_transit.update(counted)
        try:
            yield
        finally:
            self._in_transit.subtract(counted)

    @property
    def outstanding(self) -> int:
        """Deliveries of this puller not yet acked, nacked or lapsed."""
        return len(self._outstanding)

    def sweep_by(self, moment: float) -> None:
        """Look for reclaimable entries no later than ``moment`` (monotonic)."""
        self._next_sweep = min(self._next_sweep, moment)

    def restart_sweep(self, moment: float) -> None:
        """Sweep every partition from the start, no later than ``moment``."""
        self._cursors = {}
        self._next_sweep = min(self._next_sweep, moment)

    def adopt(self, deliveries: Iterable[_Delivery]) -> None:
        """Count deliveries of a closed stream of the same client as this one's."""
        for delivery in deliveries:
            if delivery.owner is None:
                delivery.owner = self
                self._outstanding[(delivery.partition, delivery.entry_id)] = delivery
                self._bytes += delivery.size

    def released(self, delivery: _Delivery) -> None:
        key = (delivery.partition, delivery.entry_id)
        if self._outstanding.get(key) is delivery:
            del self._outstanding[key]
            self._bytes -= delivery.size
            self.room.set()

    def budget(self) -> int:
        """How many messages may be delivered now (0 when a limit is reached).

        The byte limit counts as many messages as fit at the average size seen
        so far (sizes are known only once read; before any, the largest size a
        message may have), and at least one while nothing is outstanding, so
        that a message larger than the limit still goes out, alone.
        """
        free_bytes = self.max_bytes - self._bytes
        if free_bytes <= 0:
            return 0
        by_bytes = int(free_bytes // (self._average_size or _ASSUMED_SIZE))
        if by_bytes == 0 and not self._outstanding:
            by_bytes = 1
        return max(0, min(self.max_messages - len(self._outstanding), by_bytes))

    async def pull(self, block_ms: int, limit: int | None = None) -> list[Received]:
        """Up to the free budget (and ``limit``) of messages: reclaimed ones first
        when a sweep is due, else new ones, waiting up to ``block_ms``."""
        budget = self.budget()
        if limit is not None:
            budget = min(budget, limit)
        now = self._adapter._clock()
        self.last_pull = now
        if budget <= 0 or self.closed:
            return []
        taking = self._adapter.taking_for(self)
        if taking:
            received = await self._take_over(taking, budget)
            if received:
                return received
        if now >= self._next_sweep:
            # A sweep scans at most ``budget`` partitions per call; go on until it
            # finds something or has seen every partition.
            while True:
                received = await self._reclaim(budget)
                if received:
                    return received
                if not self._cursors:
                    break
        candidates = self._adapter.partitions_for(self)
        total = len(candidates)
        if not total:  # an ordered subscription with more streams here than partitions
            await asyncio.sleep(min(block_ms, _DRY_BLOCK_MS) / 1000)
            return []
        if budget >= total:
            entries = await self._read(candidates, budget, block_ms)
        else:
            # Fewer slots than partitions: one entry from each of the next
            # ``budget`` partitions, so no read takes more than the budget; a
            # round over every partition without waiting, then one that waits.
            entries = []
            rounds = -(-total // budget)
            for round_number in range(rounds + 1):
                start = self._next_partition % total
                partitions = [candidates[(start + i) % total] for i in range(budget)]
                self._next_partition = (start + budget) % total
                block = min(block_ms, _DRY_BLOCK_MS) if round_number == rounds else 1
                entries = await self._read(partitions, budget, block)
                if entries:
                    break
        self.delivered += len(entries)
        return await self._accept(entries, None)

    async def _read(self, partitions: list[int], budget: int, block_ms: int) -> list[Entry]:
        with self._transit(partitions):
            return await self._read_some(partitions, budget, block_ms)

    async def _read_some(self, partitions: list[int], budget: int, block_ms: int) -> list[Entry]:
        entries: list[Entry] = []
        block = block_ms
        while True:
            count = budget // len(partitions)
            got = await self._read_once(partitions, count, max(1, block))
            entries += got
            budget -= len(got)
            # Partitions that gave all they were asked may hold more: ask them
            # again at once for the rest of the budget (publishers fill a few
            # partitions at a time, so an even split alone leaves slots idle).
            per_partition = collections.Counter(entry.partition for entry in got)
            partitions = [p for p in partitions if per_partition[p] == count][:budget]
            if not partitions:
                return entries
            block = 1

    async def _read_once(self, partitions: list[int], count: int, block_ms: int) -> list[Entry]:
        view, backend = self.view, self._adapter._backend
        if not view.ordering:
            return await backend.read(
                view.topic, view.name, self.consumer, partitions, count, block_ms
            )
        # Owned partitions are read under their fencing tokens (see
        # streamsub._engine.ownership): a read that reaches Redis after one
        # moved to another gateway takes nothing there.
        membership = self._adapter.membership(view.name)
        owned = self._tokens(membership) or {}
        tokens = {p: owned[p] for p in partitions if p in owned}
        if not tokens:
            return []
        read = await backend.read_owned(
            view.topic, view.name, self.consumer, tokens, count, block_ms
        )
        if read.fenced and membership is not None:
            membership.fenced_out(sorted(read.fenced))
        return read.entries

    async def _reclaim(self, budget: int) -> list[Received]:
        view = self.view
        adapter = self._adapter
        allowed = self._adapter.partitions_for(self)
        if not self._cursors:
            self._cursors = dict.fromkeys(allowed, "-")
        for partition in set(self._cursors) - set(allowed):
            del self._cursors[partition]  # no longer this puller's (ordered subscriptions)
        if not self._cursors:
            self._end_sweep()
            return []
        # Never more than the budget: with fewer slots than partitions to scan,
        # this call scans only as many partitions as there are slots.
        scan = dict(itertools.islice(self._cursors.items(), budget))
        count = max(1, budget // len(scan))
        attempts = view.max_delivery_attempts if view.dead_letter_topic is not None else 0
        membership = adapter.membership(view.name) if view.ordering else None
        with self._transit(scan):
            found, cursors = await adapter._backend.reclaim(
                view.topic,
                view.name,
                self.consumer,
                scan,
                int(view.ack_deadline * 1000),
                count,
                attempts,
                tokens=self._tokens(membership),
            )
            for partition, cursor in cursors.items():
                if cursor in ("0-0", FENCED):
                    del self._cursors[partition]
                else:
                    self._cursors[partition] = cursor
            self._fenced_out(membership, cursors)
            if not self._cursors:
                self._end_sweep()
            return await self._claimed(found)

    async def _take_over(self, partitions: list[int], budget: int) -> list[Received]:
        """Sweep newly owned partitions of an ordered subscription whole: every
        entry pending there (a crashed or leaving gateway's, parked nacks too)
        is delivered here before any new entry of the partition is read."""
        view = self.view
        adapter = self._adapter
        membership = adapter.membership(view.name)
        if membership is None:
            return []
        scan = {p: membership.taking[p] for p in partitions[:budget]}
        table = adapter._tables.get(view.name)
        attempts = view.max_delivery_attempts if view.dead_letter_topic is not None else 0
        with self._transit(scan):
            found, cursors = await adapter._backend.reclaim(
                view.topic,
                view.name,
                self.consumer,
                scan,
                0,
                max(1, budget // len(scan)),
                attempts,
                {} if table is None else table.ids_of(scan),  # this gateway's own deliveries
                take_parked=True,
                tokens=self._tokens(membership),
            )
            for partition in scan:
                cursor = cursors.get(partition, "0-0")
                membership.swept(partition, "0-0" if cursor == FENCED else cursor)
            self._fenced_out(membership, cursors)
            return await self._claimed(found)

    def _tokens(self, membership: Membership | None) -> dict[int, int] | None:
        """An ordered subscription's fencing tokens (see ``_read_once``)."""
        if not self.view.ordering:
            return None
        return {} if membership is None else membership.owned

    @staticmethod
    def _fenced_out(membership: Membership | None, cursors: Mapping[int, str]) -> None:
        fenced = sorted(p for p, cursor in cursors.items() if cursor == FENCED)
        if fenced and membership is not None:
            membership.fenced_out(fenced)

    async def _claimed(self, found: Sequence[Reclaimed]) -> list[Received]:
        view = self.view
        deliver: list[Entry] = []
        first: list[int] = []
        for item in found:
            if item.state == "deliver":
                deliver.append(item.entry)
                first.append(item.first_delivery_ms)
            elif item.state == "exhausted":
                await self._dead_letter(
                    item.entry,
                    f"delivered {item.entry.delivery_count} times (max_delivery_attempts)",
                    item.first_delivery_ms,
                    item.last_delivery_ms,
                )
            else:
                metrics.on_lost(view.name)
                log.warning(
                    "streamsub gateway: entry %s-%s of %r was trimmed before anyone acked it",
                    item.entry.partition,
                    item.entry.entry_id,
                    view.topic.name,
                )
        self.redelivered += len(deliver)
        return await self._accept(deliver, first)

    def _end_sweep(self) -> None:
        deadline = self.view.ack_deadline
        interval = min(max(deadline / 4, _RECLAIM_EVERY[0]), _RECLAIM_EVERY[1])
        self._next_sweep = self._adapter._clock() + interval

    async def _dead_letter(
        self, entry: Entry, reason: str, first_ms: int | None, last_ms: int | None
    ) -> None:
        view = self.view
        target = view.dead_letter_topic
        assert target is not None  # entries come back exhausted only when there is one
        try:
            decoded = decode(entry.fields)
        except UndecodableEntry as exc:
            decoded = None
            reason = f"{UNDECODABLE}: {exc.reason}"
        encoded = dead_letter_message(
            decoded,
            raw_fields=entry.fields,
            topic=view.topic.name,
            subscription=view.name,
            message_id=f"{entry.partition}-{entry.entry_id}",
            delivery_attempts=entry.delivery_count,
            reason=reason,
        )
        if encoded.ordering_key is not None:
            target_partition = partition_for_key(encoded.ordering_key, target.partitions)
        else:
            target_partition = entry.partition % target.partitions
        moved = await self._adapter._backend.dead_letter(
            view.topic,
            view.name,
            self.consumer,
            entry.partition,
            entry.entry_id,
            target,
            target_partition,
            encoded.packed,
            first_ms,
            last_ms,
        )
        if moved is not None:  # None: not this consumer's any more, nothing written
            self.dead_lettered += 1
            metrics.on_dead_lettered(view.name)

    async def _accept(self, entries: list[Entry], first_ms: list[int] | None) -> list[Received]:
        # Until the last entry is in the lease table (undecodable ones cost a
        # Redis call each), the partitions still count as read.
        with self._transit(entry.partition for entry in entries):
            return await self._accept_all(entries, first_ms)

    async def _accept_all(self, entries: list[Entry], first_ms: list[int] | None) -> list[Received]:
        view = self.view
        adapter = self._adapter
        now = adapter._clock()
        now_ms = int(adapter._wall_clock() * 1000)
        table = adapter._table(view)
        received: list[Received] = []
        for index, entry in enumerate(entries):
            try:
                decoded = decode(entry.fields)
            except UndecodableEntry as exc:
                await self._undecodable(entry, exc.reason, first_ms[index] if first_ms else now_ms)
                continue
            delivery = _Delivery(
                partition=entry.partition,
                entry_id=entry.entry_id,
                attempt=entry.delivery_count,
                consumer=self.consumer,
                size=decoded.size,
                delivered_ms=now_ms,
                lease_end=now + self.deadline,
                set_at=now,
                final=False,
                owner=None if self.closed else self,
            )
            table.add(delivery)
            if not self.closed:
                self._outstanding[(entry.partition, entry.entry_id)] = delivery
                self._bytes += decoded.size
                size = max(decoded.size, 1)
                if self._average_size is None:
                    self._average_size = float(size)
                else:
                    self._average_size += (size - self._average_size) / 16
            ack_id = format_ack_id(
                entry.partition, entry.entry_id, entry.delivery_count, self.consumer
            )
            received.append(
                Received(
                    ack_id=ack_id,
                    message_id=f"{entry.partition}-{entry.entry_id}",
                    data=decoded.data,
                    attributes=decoded.attributes,
                    ordering_key=decoded.ordering_key,
                    publish_ms=int(entry.entry_id.split("-", 1)[0]),
                    delivery_attempt=entry.delivery_count,
                )
            )
        if received:
            again = sum(1 for item in received if item.delivery_attempt > 1)
            metrics.on_delivered(view.name, len(received), redelivered=again)
        return received

    async def _undecodable(self, entry: Entry, reason: str, first_ms: int) -> None:
        log.warning(
            "streamsub gateway: entry %s-%s of %r is undecodable (%s)",
            entry.partition,
            entry.entry_id,
            self.view.topic.name,
            reason,
        )
        if self.view.dead_letter_topic is not None:
            await self._dead_letter(entry, f"{UNDECODABLE}: {reason}", first_ms, None)
            return
        delay_ms = int(backoff(self.view.retry_policy, entry.delivery_count) * 1000)
        now_ms = int(self._adapter._wall_clock() * 1000)
        await self._adapter._backend.nack(
            self.view.topic,
            self.view.name,
            self.consumer,
            {
                entry.partition: [
                    NackItem(entry.entry_id, delay_ms, now_ms, entry.delivery_count, True)
                ]
            },
            int(self.view.ack_deadline * 1000),
        )

    async def close(self, *, hand_back: bool) -> None:
        """Stop delivering. With ``hand_back`` the deliveries still outstanding are
        given back at once; without, their leases run on (the client may still
        ack them on another stream)."""
        self.closed = True
        self._adapter._leave(self)
        outstanding = list(self._outstanding.values())
        for delivery in outstanding:
            delivery.owner = None
        self._outstanding.clear()
        self._bytes = 0
        if not hand_back and self.client_id:
            self._adapter.carry(self, outstanding)
        if hand_back and outstanding:
            ack_ids = [
                format_ack_id(d.partition, d.entry_id, d.attempt, d.consumer) for d in outstanding
            ]
            try:
                await self._adapter._nack(self.view, ack_ids, backoff_delay=False)
            except StreamsubError as exc:  # Redis gone, or the subscription deleted
                log.warning(
                    "streamsub gateway: could not give back %d leases of %r (%s); they "
                    "return when their deadlines pass",
                    len(ack_ids),
                    self.view.name,
                    exc,
                )
