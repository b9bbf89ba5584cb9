"""The subscriber's flow controller: how much may be read, held and run now.

A message is *outstanding* from the moment it is read (or reclaimed) until it is
acked, nacked, dead-lettered or released. Before a read or a reclaim is sent it
*reserves* its share of the budget, in messages and in bytes, so that reads and
reclaims in flight together never ask for more than what is free.

The bounds, exactly:

- **messages**: outstanding messages plus reservations never exceed
  ``max_messages``. A read asks the server for no more than it reserved (it
  reads fewer partitions when it may take fewer messages than there are
  partitions), so the bound holds for what is held, not only for what runs.
- **bytes**: the server cannot be asked for bytes, only for a count, so a read
  reserves ``count * estimate`` bytes, where the estimate is the mean size of
  the messages the previous read returned. Before any message was seen the
  estimate is ``max_bytes``: the first read asks for one message. Outstanding
  bytes plus reserved bytes stay under ``max_bytes`` at the estimate; what is
  held can exceed ``max_bytes`` only by how much the messages of the reads in
  flight exceed the estimate (not at all when sizes are even). One message
  larger than ``max_bytes`` is still read, alone, once nothing else is
  outstanding, so it cannot stall the subscription.
- **running**: a held message starts (its handler runs) only while fewer than
  ``max_messages`` run and its bytes fit under ``max_bytes``; the others wait on
  hold in arrival order.

Reading pauses at full load and resumes below :data:`RESUME_THRESHOLD` (80 %),
as Pub/Sub's clients do: once what is held reaches either bound, no more is
granted until what is outstanding and reserved falls under 80 % of both
bounds, so a subscriber at capacity reads a fifth of its budget at a time
rather than one message per finished handler.

The reclaimer reserves like a reader. Idle reads hold their reservation while
the server blocks them, so a reclaimer that finds no room asks for *priority*:
readers are then refused until the reclaimer has reserved (they give their
reservation back when their blocked read ends).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from .._settings import FlowControl

__all__ = ["RESUME_THRESHOLD", "FlowController", "FlowStatistics", "Grant"]

T = TypeVar("T")

RESUME_THRESHOLD = 0.8
"""Reading paused at full load resumes once the load is below this (python-pubsub's)."""


class Grant(NamedTuple):
    """A reservation for one read or reclaim: messages, and bytes at the estimate."""

    messages: int
    bytes: int


NO_GRANT = Grant(0, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class FlowStatistics:
    """A snapshot of the flow controller."""

    outstanding_messages: int
    outstanding_bytes: int
    running_messages: int
    running_bytes: int
    on_hold: int
    paused: bool = False
    """Reading is paused: the budget was full and the load is not yet below 80 %."""
    pauses: int = 0
    """Times reading paused at full load since the subscriber started (a pause
    counts once, however long; the next one after a read was granted below
    80 %): ``paused`` is the moment, this count only grows."""


class FlowController(Generic[T]):
    """Counts outstanding and running messages and bytes; holds what cannot run."""

    __slots__ = (
        "_estimate",
        "_hold",
        "_max_bytes",
        "_max_messages",
        "_outstanding",
        "_outstanding_bytes",
        "_paused",
        "_pauses",
        "_priority",
        "_reserved",
        "_reserved_bytes",
        "_running",
        "_running_bytes",
    )

    def __init__(self, settings: FlowControl) -> None:
        self._max_messages = settings.max_messages
        self._max_bytes = settings.max_bytes
        self._outstanding = 0
        self._outstanding_bytes = 0
        self._reserved = 0
        self._reserved_bytes = 0
        self._running = 0
        self._running_bytes = 0
        self._estimate = settings.max_bytes  # until a read shows the real size
        self._priority = False
        self._paused = False
        self._pauses = 0
        self._hold: collections.deque[tuple[T, int]] = collections.deque()

    @property
    def size_estimate(self) -> int:
        """Bytes per message that reservations assume."""
        return self._estimate

    @property
    def idle(self) -> bool:
        """Nothing outstanding and nothing reserved."""
        return self._outstanding == 0 and self._reserved == 0

    def reserve(self, wanted: int, *, priority: bool = False, overdraft: int = 0) -> Grant:
        """Set aside up to ``wanted`` messages (and their bytes at the estimate) for a
        read or reclaim about to be sent. Returns ``Grant(0, 0)`` when nothing fits.

        While a ``priority`` caller (the reclaimer) waits, others are refused.
        ``overdraft`` lets it hold up to that many messages beyond ``max_messages``
        (paused or not, whatever their bytes): on an ordered subscription, one
        per key blocked on a nacked message, so that the message can come back
        even when the key's later messages fill the budget.
        """
        if self._priority and not priority:
            return NO_GRANT
        free = self._max_messages - self._outstanding - self._reserved
        free_bytes = self._max_bytes - self._outstanding_bytes - self._reserved_bytes
        count = 0
        if not self._paused or self.load() < RESUME_THRESHOLD:
            self._paused = False
            count = min(wanted, free, free_bytes // self._estimate)
        if count <= 0 and overdraft > 0:
            count = min(wanted, free + overdraft)
        if count <= 0:
            if not (wanted > 0 and self.idle):
                return NO_GRANT
            count = 1  # a message larger than max_bytes still flows, alone
        grant = Grant(count, count * self._estimate)
        self._reserved += grant.messages
        self._reserved_bytes += grant.bytes
        if priority:
            self._priority = False
        return grant

    def load(self) -> float:
        """Outstanding and reserved, as a share of the tighter bound."""
        return max(
            (self._outstanding + self._reserved) / self._max_messages,
            (self._outstanding_bytes + self._reserved_bytes) / self._max_bytes,
        )

    def want_priority(self) -> None:
        """A priority caller found no room: refuse the others until it has reserved."""
        self._priority = True

    def unreserve(self, grant: Grant) -> None:
        """Give back a reservation whose read returned nothing or failed."""
        self._reserved -= grant.messages
        self._reserved_bytes -= grant.bytes

    def received(
        self,
        items: Sequence[tuple[T, int]],
        grant: Grant = NO_GRANT,
        *,
        aside: Sequence[int] = (),
    ) -> list[T]:
        """Count read messages ``(item, size)`` as outstanding, releasing ``grant``;
        return those that start now. ``aside`` are sizes of messages held without a
        handler (to be dead-lettered, or held back for order): outstanding until
        ``finished(started=False)`` or :meth:`admit_later`.
        """
        self._reserved -= grant.messages
        self._reserved_bytes -= grant.bytes
        items_bytes = sum([size for _, size in items])
        total = items_bytes + sum(aside)
        count = len(items) + len(aside)
        self._outstanding += count
        self._outstanding_bytes += total
        if (
            self._outstanding >= self._max_messages or self._outstanding_bytes >= self._max_bytes
        ) and not self._paused:
            self._paused = True  # full load: the next read waits for 80 %
            self._pauses += 1
        if count:
            self._estimate = max(1, total // count)
        if not self._hold:  # the usual case: all of them fit, start them as they are
            running = self._running + len(items)
            running_bytes = self._running_bytes + items_bytes
            if running <= self._max_messages and (
                running_bytes <= self._max_bytes or running == len(items) == 1
            ):
                self._running, self._running_bytes = running, running_bytes
                return [item for item, _ in items]
        self._hold.extend(items)
        return self._admit()

    def admit_later(self, items: Sequence[tuple[T, int]]) -> list[T]:
        """Messages counted outstanding earlier without a handler (``aside``, held
        back for order) may run now: return those that start now, hold the rest."""
        self._hold.extend(items)
        return self._admit()

    def finished(self, size: int, *, started: bool = True) -> list[T]:
        """One outstanding message of ``size`` is done; return messages that start now."""
        self._outstanding -= 1
        self._outstanding_bytes -= size
        if started:
            self._running -= 1
            self._running_bytes -= size
        if not self._hold:
            return []
        return self._admit()

    def finished_many(self, count: int, size: int) -> list[T]:
        """``count`` running messages of ``size`` bytes in all are done; return
        messages that start now (as many :meth:`finished` calls)."""
        self._outstanding -= count
        self._outstanding_bytes -= size
        self._running -= count
        self._running_bytes -= size
        if not self._hold:
            return []
        return self._admit()

    def take_from_hold(self, chosen: Callable[[T], bool]) -> list[T]:
        """Take the messages on hold that are ``chosen`` (to give them back); they
        stay outstanding until ``finished(started=False)``."""
        taken = [item for item, _ in self._hold if chosen(item)]
        if taken:
            self._hold = collections.deque(entry for entry in self._hold if not chosen(entry[0]))
        return taken

    def drain_hold(self) -> list[T]:
        """Take every message on hold (to release them at shutdown); they stay
        outstanding until ``finished(started=False)``."""
        items = [item for item, _ in self._hold]
        self._hold.clear()
        return items

    def statistics(self) -> FlowStatistics:
        """A snapshot of the counts."""
        return FlowStatistics(
            self._outstanding,
            self._outstanding_bytes,
            self._running,
            self._running_bytes,
            len(self._hold),
            self._paused and self.load() >= RESUME_THRESHOLD,
            self._pauses,
        )

    def _admit(self) -> list[T]:
        ready: list[T] = []
        hold = self._hold
        while hold:
            item, size = hold[0]
            if self._running >= self._max_messages:
                break
            if self._running and self._running_bytes + size > self._max_bytes:
                break
            hold.popleft()
            self._running += 1
            self._running_bytes += size
            ready.append(item)
        return ready
