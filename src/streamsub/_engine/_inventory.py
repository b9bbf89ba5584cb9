"""What one subscriber holds: the messages read and not yet settled.

It puts the flow controller and the lease book from ``_core`` together with
the table of held messages, so that every part of the receiver agrees on one
count. Reads and reclaims reserve budget here and wait for room; the settler
takes messages out; what that frees goes to the dispatcher through the
``start`` callback the receiver connects.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Sequence

from .._core.flow import FlowController, Grant
from .._core.lease import LeaseBook
from .._core.ordering import KeyOrder, position
from .._message import Message
from .._settings import FlowControl

__all__ = ["Counters", "Inventory", "Key", "key_of"]

Key = tuple[int, str]
"""(partition, entry id)."""


def key_of(message: Message) -> Key:
    return (message._partition, message._entry_id)


@dataclasses.dataclass(slots=True)
class Counters:
    """The subscriber's running counts, kept by the parts that see each event."""

    received: int = 0
    reclaimed: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    lost: int = 0
    handler_errors: int = 0
    expired: int = 0


class Inventory:
    """Held messages, their leases and the flow-control counts, kept together."""

    def __init__(
        self,
        flow_control: FlowControl,
        *,
        ack_deadline: float,
        max_lease_duration: float,
        clock: Callable[[], float],
        ordered: bool = False,
    ) -> None:
        self.flow: FlowController[Message] = FlowController(flow_control)
        self.order: KeyOrder[Message] | None = KeyOrder() if ordered else None
        """On an ordered subscription: which message of each key may run."""
        self.blocking: dict[Key, str] = {}
        """Entries that block their ordering key (nacked or given back), and the key."""
        self.leases: LeaseBook[Key] = LeaseBook(
            ack_deadline=ack_deadline, max_lease_duration=max_lease_duration
        )
        self.held: dict[Key, Message] = {}
        self.settling: set[Key] = set()
        """Settled here, their ack, nack or dead letter not yet confirmed by the
        server: still leased and still skipped by our reclaimer, so a late send
        never lets the message be delivered again meanwhile."""
        self._clock = clock
        self._room = asyncio.Event()
        self._start: Callable[[list[Message]], None] = _nowhere

    def connect(self, start: Callable[[list[Message]], None]) -> None:
        """Send the messages that may start now to ``start``."""
        self._start = start

    def now(self) -> float:
        """The clock leases are kept by."""
        return self._clock()

    async def reserve(self, wanted: int, *, priority: bool = False) -> Grant:
        """Reserve budget for a read of up to ``wanted`` messages, waiting for room."""
        while True:
            self._room.clear()
            # A key blocked on a nacked message waits for it: the reclaimer may
            # bring one per blocked key past the budget its later messages fill.
            overdraft = len(self.blocking) if priority else 0
            grant = self.flow.reserve(wanted, priority=priority, overdraft=overdraft)
            if grant.messages:
                return grant
            if priority:
                self.flow.want_priority()
            await self._room.wait()

    def unreserve(self, grant: Grant) -> None:
        """A read returned nothing or failed: its reservation is free again."""
        if grant.messages:
            self.flow.unreserve(grant)
            self._room.set()

    def take(self, messages: Sequence[Message], grant: Grant, *, aside: Sequence[int] = ()) -> None:
        """Hold and lease read messages; start those that fit. ``aside`` are sizes of
        entries held without a handler until :meth:`finish_aside`."""
        held = self.held
        keys = []
        for message in messages:
            key = (message._partition, message._entry_id)
            old = held.get(key)
            if old is not None:
                # Delivered again while held (a seek moved the group back): the old
                # delivery is no longer ours to settle, and its budget is free.
                self.leases.remove(key)
                self.flow.finished(old._size, started=old._started)
                self._forget_order(old)
                if self.order is not None and old.ordering_key and old._started:
                    # Its handler may still run, but the new delivery is the one to
                    # settle: the key waits for it, and it runs now.
                    self.order.done(old.ordering_key, position(old._entry_id), settled=False)
            held[key] = message
            keys.append(key)
        self.leases.add_many(keys, self._clock())
        order = self.order
        if order is not None:
            ready: list[Message] = []
            later = list(aside)
            for message in messages:
                key_ = message.ordering_key
                if not key_ or order.offer(key_, position(message._entry_id), message):
                    ready.append(message)
                else:
                    later.append(message._size)
            messages, aside = ready, later
        admitted = self.flow.received([(m, m._size) for m in messages], grant, aside=aside)
        if len(messages) + len(aside) < grant.messages:
            self._room.set()
        if admitted:
            self._start(admitted)

    def settle(self, message: Message, *, done: bool = True) -> bool:
        """Take ``message`` out: acked or dead-lettered (``done``), or nacked or given
        back (its key, on an ordered subscription, blocks until it is back). Return
        False when it is not held (settled before, or a newer delivery is held)."""
        key = (message._partition, message._entry_id)
        if self.held.get(key) is not message:
            return False
        del self.held[key]
        self.settling.add(key)  # its lease stays until the server has the outcome
        admitted = self.flow.finished(message._size, started=message._started)
        if self.order is not None and message.ordering_key:
            if message._started:
                at = position(message._entry_id)
                after = self.order.done(message.ordering_key, at, settled=done)
                admitted += self.flow.admit_later([(m, m._size) for m in after])
            else:
                self._forget_order(message)
            if done:
                self.blocking.pop(key, None)
            elif self.order.blocked_on(message.ordering_key) is not None:
                self.blocking[key] = message.ordering_key
        self._room.set()
        if admitted:
            self._start(admitted)
        return True

    def settle_many(self, messages: list[Message]) -> list[Message]:
        """:meth:`settle` each of ``messages``, all started, as done (acked); return
        those that were held. One pass, one flow-control update: the messages of
        the handlers that returned in one turn of the loop."""
        if self.order is not None:  # each may let its key's next one start
            return [m for m in messages if self.settle(m)]
        held, settling = self.held, self.settling
        settled: list[Message] = []
        size = 0
        for message in messages:
            key = (message._partition, message._entry_id)
            if held.get(key) is not message:
                continue
            del held[key]
            settling.add(key)  # its lease stays until the server has the outcome
            settled.append(message)
            size += message._size
        if settled:
            admitted = self.flow.finished_many(len(settled), size)
            self._room.set()
            if admitted:
                self._start(admitted)
        return settled

    def withdraw(self, message: Message) -> list[Message] | None:
        """Take out ``message``, which flow control let start but no handler saw
        (its partition is no longer ours), as given back: its key, on an ordered
        subscription, blocks until it is back. Return the messages that may start
        now, or None when it is not held."""
        key = (message._partition, message._entry_id)
        if self.held.get(key) is not message:
            return None
        del self.held[key]
        self.settling.add(key)
        admitted = self.flow.finished(message._size, started=True)
        if self.order is not None and message.ordering_key:
            self._forget_order(message)
            if self.order.blocked_on(message.ordering_key) is not None:
                self.blocking[key] = message.ordering_key
        self._room.set()
        return admitted

    def expire(self, key: Key) -> Message | None:
        """The lease of ``key`` ended (``max_lease_duration``, or the end
        ``modify_ack_deadline`` set). A message whose handler runs is given up, as
        Pub/Sub's clients drop it: it no longer counts against flow control, its
        late ack or nack settles nothing, and it may be delivered again, here too;
        on an ordered subscription its key waits for that redelivery. Return it.
        One that waits for its turn (or for room) keeps waiting, leased anew."""
        message = self.held.get(key)
        if message is None:
            return None
        if not message._started:
            self.leases.add(key, self._clock())
            return None
        del self.held[key]
        admitted = self.flow.finished(message._size, started=True)
        if self.order is not None and message.ordering_key:
            at = position(message._entry_id)
            after = self.order.done(message.ordering_key, at, settled=False)
            admitted += self.flow.admit_later([(m, m._size) for m in after])
            if self.order.blocked_on(message.ordering_key) is not None:
                self.blocking[key] = message.ordering_key
        self._room.set()
        if admitted:
            self._start(admitted)
        return message

    def unblock(self, partition: int, entry_id: str) -> None:
        """The entry that blocks an ordering key was settled without coming back here
        (dead-lettered out of attempts, taken by another subscriber, trimmed): the
        key's next message may run."""
        ordering_key = self.blocking.pop((partition, entry_id), None)
        if self.order is not None and ordering_key is not None:
            after = self.order.unblock(ordering_key, position(entry_id))
            if after:
                admitted = self.flow.admit_later([(m, m._size) for m in after])
                if admitted:
                    self._start(admitted)

    def _forget_order(self, message: Message) -> None:
        """A message no handler saw is no longer held."""
        if self.order is not None and message.ordering_key and not message._started:
            self.order.discard(message.ordering_key, position(message._entry_id))

    def sent(self, partition: int, entry_ids: Iterable[str]) -> None:
        """The server has the outcome of these entries: their leases end."""
        settling, held = self.settling, self.held
        ended = []
        for entry_id in entry_ids:
            key = (partition, entry_id)
            if key in settling:
                settling.remove(key)
                if key not in held:  # not delivered again meanwhile
                    ended.append(key)
        self.leases.remove_many(ended)

    def forget_settling(self) -> None:
        """Outcomes that will never be sent (shutdown with the server gone)."""
        for key in self.settling:
            if key not in self.held:
                self.leases.remove(key)
        self.settling.clear()

    def finish_aside(self, size: int) -> None:
        """An entry held without a handler was settled."""
        admitted = self.flow.finished(size, started=False)
        self._room.set()
        if admitted:
            self._start(admitted)

    def drain_hold(self) -> list[Message]:
        """The messages read but not started (at shutdown, to give them back)."""
        waiting = self.order.drain() if self.order is not None else []
        return [*self.flow.drain_hold(), *waiting]

    def take_waiting(self, partitions: Iterable[int]) -> list[Message]:
        """The held messages of ``partitions`` that have not started (waiting for
        their key's turn or for room), out of the flow hold: to give them back."""
        chosen = set(partitions)
        waiting = [m for m in self.held.values() if m._partition in chosen and not m._started]
        self.flow.take_from_hold(lambda m: m._partition in chosen)
        return waiting

    def holds(self, partition: int) -> bool:
        """Whether a message of ``partition`` is held or its outcome not yet sent."""
        return any(p == partition for p, _ in self.held) or any(
            p == partition for p, _ in self.settling
        )

    def held_ids(self) -> dict[int, list[str]]:
        """Entry ids held or settling, per partition: what our reclaimer leaves alone."""
        ids: dict[int, list[str]] = {}
        for partition, entry_id in (*self.held, *self.settling):
            ids.setdefault(partition, []).append(entry_id)
        return ids

    def messages(self) -> Iterable[Message]:
        """Every held message (a copy: settling while iterating is safe)."""
        return list(self.held.values())


def _nowhere(messages: list[Message]) -> None:
    raise RuntimeError("Inventory.connect() was not called")
