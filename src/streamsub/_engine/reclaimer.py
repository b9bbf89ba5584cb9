"""The reclaimer: takes over entries idle for the ack deadline.

Those are a crashed or stuck consumer's messages, nacked ones whose backoff has
passed, and entries out of delivery attempts (dead-lettered). It sweeps every
quarter ack deadline, so a crashed consumer's messages come back within 1.25
ack deadlines, and sooner when a nack is due. It reserves flow-control budget
like a reader, asking for priority when idle reads hold it all; the entries its
own handlers still hold are left alone. Every so often it also deletes the
group's consumers that are idle and hold nothing. On an ordered subscription
its sweeps are fenced as reads are (``tokens``): a partition whose fence holds
a newer owner's token is not swept but reported ``fenced``; and a sweep
started before a partition began to be handed over (``leaving``) sends
nothing more for it: it counts as busy (holding the move) only while a call
naming it is at the server, not while the sweep waits for flow-control room
that another partition's slow key may hold for long.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from .. import metrics
from .._backends.base import FENCED, Backend, Reclaimed, TopicRecord
from .._core.flow import Grant
from .._errors import NotFoundError, StreamsubError
from ._inventory import Counters, Inventory
from ._retrying import Backoff, raise_if_cancelled
from .ownership import Assignment

__all__ = ["Reclaimer"]

log = logging.getLogger("streamsub")

RECLAIM_BATCH = 100
"""Entries claimed per partition per call, at most."""
CONSUMER_SWEEP_EVERY = 60.0
"""Seconds between looks for idle, empty consumers to delete (or half the
consumer expiry, when that is shorter)."""


class Reclaimer:
    """Sweeps the subscription's pending entries for idle ones."""

    def __init__(
        self,
        *,
        backend: Backend,
        topic: TopicRecord,
        group: str,
        consumer: str,
        inventory: Inventory,
        counters: Counters,
        deliver: Callable[[Sequence[Reclaimed], Grant], None],
        ack_deadline: float,
        max_attempts: int,
        consumer_expiry: float,
        assignment: Assignment,
        clock: Callable[[], float],
        tokens: Callable[[], Mapping[int, int]] | None = None,
        fenced: Callable[[list[int]], None] = lambda partitions: None,
        leaving: Callable[[], Collection[int]] = frozenset,
    ) -> None:
        self._backend = backend
        self._leaving = leaving
        self._topic = topic
        self._group = group
        self._tokens = tokens
        self._fenced = fenced
        self._consumer = consumer
        self._inventory = inventory
        self._counters = counters
        self._deliver = deliver
        self._min_idle_ms = int(ack_deadline * 1000)
        self._interval = ack_deadline / 4
        self._max_attempts = max_attempts
        self._consumer_expiry = consumer_expiry
        self._clock = clock
        self._wake = asyncio.Event()
        self._due: float | None = None
        self._stopping = False
        self._assignment = assignment
        self.at_server = False
        """True while a reclaim call is at the server (stop lets it finish)."""
        self._sweeping: collections.Counter[int] = collections.Counter()
        """Partitions named by the reclaim calls at the server now (a periodic
        sweep's, take-overs', recoveries')."""

    def wake_in(self, seconds: float) -> None:
        """Sweep ``seconds`` from now (a nack is due then), unless sooner already."""
        if self._stopping:
            return
        due = self._clock() + seconds
        if self._due is None or due < self._due:
            self._due = due
            self._wake.set()

    def stop(self) -> None:
        """Start no more sweeps."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        errors = Backoff()
        sweep_consumers_every = min(CONSUMER_SWEEP_EVERY, self._consumer_expiry / 2)
        next_consumer_sweep = self._clock() + sweep_consumers_every
        next_sweep = self._clock()  # at start: take over what others gave back
        while not self._stopping:
            raise_if_cancelled()
            now = self._clock()
            sweep_at = next_sweep if self._due is None else min(next_sweep, self._due)
            if min(sweep_at, next_consumer_sweep) > now:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), min(sweep_at, next_consumer_sweep) - now
                    )
                continue
            try:
                if sweep_at <= now:
                    next_sweep = now + self._interval
                    if self._due is not None and self._due <= now:
                        self._due = None
                    await self.sweep()
                if self._clock() >= next_consumer_sweep:
                    next_consumer_sweep = self._clock() + sweep_consumers_every
                    await self._delete_idle_consumers()
            except NotFoundError:
                raise
            except StreamsubError as exc:
                if self._stopping:
                    return
                await errors.wait("reclaiming", exc)
                continue
            errors.reset()

    async def sweep(self) -> None:
        """One pass over the idle pending entries of the partitions this subscriber
        reads."""
        await self._sweep(self._assignment.swept, self._min_idle_ms, take_parked=False)

    async def take_over(self, partitions: list[int]) -> list[int]:
        """Take every entry still pending in ``partitions`` (newly owned), idle or
        not, nacked ones whose backoff runs included (so that no later message of
        their key overtakes them), but for those this subscriber holds. Returns
        the partitions whose sweep was cut short: no longer surely ours."""
        return await self._sweep(partitions, 0, take_parked=True)

    async def recover(self, partitions: list[int]) -> None:
        """Take back every entry pending in ``partitions``, idle or not, but for
        those this subscriber holds and nacks waiting out their backoff: a read
        whose reply was lost may have delivered them here."""
        await self._sweep(partitions, 0, take_parked=False)

    def sweeping(self, partition: int) -> bool:
        """Whether a reclaim call naming ``partition`` is at the server (what it
        brings is not delivered yet)."""
        return self._sweeping[partition] > 0

    async def _sweep(self, partitions: list[int], min_idle_ms: int, take_parked: bool) -> list[int]:
        """Sweep ``partitions``; return those cut short (no longer surely ours)."""
        max_attempts = self._max_attempts
        inventory = self._inventory
        cursors = dict.fromkeys(partitions, "-")
        cut: list[int] = []
        while cursors and not self._stopping:
            grant = await inventory.reserve(RECLAIM_BATCH * len(cursors), priority=True)
            # Partitions being handed over (maybe since the reservation began)
            # are their next owner's to take over: nothing more is claimed there.
            leaving = self._leaving()
            if leaving:
                cursors = {p: c for p, c in cursors.items() if p not in leaving}
                if not cursors:
                    inventory.unreserve(grant)
                    break
            tokens = None if self._tokens is None else self._tokens()
            if tokens is not None:
                # Ordered: only partitions surely ours now, checked before each
                # call (waiting for flow-control room can outlast a lease).
                cut += [p for p in cursors if p not in tokens]
                cursors = {p: c for p, c in cursors.items() if p in tokens}
                if not cursors:
                    inventory.unreserve(grant)
                    break
            if grant.messages < len(cursors):  # room for a few: that many partitions
                batch = dict(list(cursors.items())[: grant.messages])
                count = 1
            else:
                batch = cursors
                count = min(RECLAIM_BATCH, grant.messages // len(cursors))
            self.at_server = True
            self._sweeping.update(list(batch))
            try:
                found, next_cursors = await self._backend.reclaim(
                    self._topic,
                    self._group,
                    self._consumer,
                    batch,
                    min_idle_ms,
                    count,
                    max_attempts,
                    # What our handlers still hold is ours, leased or not: claiming
                    # it again would count a delivery that does not happen.
                    inventory.held_ids(),
                    take_parked=take_parked,
                    tokens=tokens,
                )
            except BaseException:
                inventory.unreserve(grant)
                raise
            finally:
                # What it brought is delivered below, before the next await.
                self.at_server = False
                self._sweeping.subtract(list(batch))
            taken: list[Reclaimed] = []
            for item in found:
                entry = item.entry
                if item.state == "lost":
                    self._counters.lost += 1
                    metrics.on_lost(self._group)
                    log.error(
                        "streamsub: message %s-%s of %r was trimmed before it was acknowledged "
                        "and is lost",
                        entry.partition,
                        entry.entry_id,
                        self._group,
                    )
                else:
                    taken.append(item)
            if taken:
                log.info(
                    "streamsub: took over %d idle messages of %r (a consumer crashed or "
                    "stalled, or their nack backoff ended)",
                    len(taken),
                    self._group,
                )
            self._deliver(taken, grant)
            for item in found:
                if item.state == "lost":
                    inventory.unblock(item.entry.partition, item.entry.entry_id)
            cursors.update(next_cursors)
            fenced = sorted(p for p, c in cursors.items() if c == FENCED)
            if fenced:
                self._fenced(fenced)
            cursors = {p: c for p, c in cursors.items() if c not in ("0-0", FENCED)}
        if inventory.blocking and not self._stopping:
            await self._check_blocking()
        return cut

    async def _check_blocking(self) -> None:
        """Ordered subscriptions: a key blocked on a nacked entry waits for that entry
        to come back here. If it is acknowledged elsewhere or trimmed meanwhile
        (pending nowhere), the key moves on."""
        inventory = self._inventory
        ids: dict[int, list[str]] = {}
        for partition, entry_id in inventory.blocking:
            if (partition, entry_id) not in inventory.settling:  # our nack is sent
                ids.setdefault(partition, []).append(entry_id)
        if not ids:
            return
        owners = await self._backend.pending_owners(self._topic, self._group, ids)
        for (partition, entry_id), owner in owners.items():
            # Pending under another consumer, it is being handled there (or will
            # come back here once idle): the key waits, so that no later message
            # of it runs beside it.
            if owner is None:
                inventory.unblock(partition, entry_id)

    async def _delete_idle_consumers(self) -> None:
        deleted = await self._backend.delete_idle_consumers(
            self._topic, self._group, self._consumer, int(self._consumer_expiry * 1000)
        )
        if deleted:
            log.info(
                "streamsub: deleted idle consumers of %r that held nothing: %s",
                self._group,
                ", ".join(deleted),
            )
