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


class Inventory:
    """Held messages, their leases and the flow-control counts, kept together."""

    def __init__(
        self,
        flow_control: FlowControl,
        *,
        ack_deadline: float,
        max_lease_duration: float,
        clock: Callable[[], float],
    ) -> None:
        self.flow: FlowController[Message] = FlowController(flow_control)
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
            grant = self.flow.reserve(wanted, priority=priority)
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
            held[key] = message
            keys.append(key)
        self.leases.add_many(keys, self._clock())
        admitted = self.flow.received([(m, m._size) for m in messages], grant, aside=aside)
        if len(messages) + len(aside) < grant.messages:
            self._room.set()
        if admitted:
            self._start(admitted)

    def settle(self, message: Message) -> bool:
        """Take ``message`` out (acked, nacked, dead-lettered or given back); return
        False when it is not held (settled before, or a newer delivery is held)."""
        key = (message._partition, message._entry_id)
        if self.held.get(key) is not message:
            return False
        del self.held[key]
        self.settling.add(key)  # its lease stays until the server has the outcome
        admitted = self.flow.finished(message._size, started=message._started)
        self._room.set()
        if admitted:
            self._start(admitted)
        return True

    def sent(self, partition: int, entry_ids: Iterable[str]) -> None:
        """The server has the outcome of these entries: their leases end."""
        for entry_id in entry_ids:
            key = (partition, entry_id)
            if key in self.settling:
                self.settling.discard(key)
                if key not in self.held:  # not delivered again meanwhile
                    self.leases.remove(key)

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
        return self.flow.drain_hold()

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
