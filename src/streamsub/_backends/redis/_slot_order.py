"""The order of a cluster slot's writes while the slot moves (no I/O).

The cluster appender (``_cluster.py``) sends a slot's writes in order, several
in flight on one connection. When the slot moves, each write comes back
``MOVED`` (or ``ASK``) and is sent again to the new node, and a new write goes
there directly once the appender's map names it. Redis keeps the order of one
connection's commands, not of the calls that handle their replies: a write
sent again, or a new one, could reach the new node before an earlier write
still on its way back from the old one (a publisher's link then refuses it:
``BROKENLINK``). :class:`SlotOrder` keeps each slot's writes in the order they
first left and says when one may be sent to a node: when every earlier write
of its slot is in flight at that same node, or was sent there with ``ASKING``
(the node it will be stored on: a write bound for the migrating slot's source
comes back ``ASK`` and follows it), and none is waiting to be sent again.
"""

from __future__ import annotations

import asyncio
import itertools


class Flight:
    """One write of a slot, from its first send until it is answered (or given up)."""

    __slots__ = ("asked", "node", "number", "pending")

    def __init__(self, number: int, node: str, asked: bool) -> None:
        self.number = number
        """Its place among the slot's writes: the order they first left."""
        self.node = node
        """The node it was last sent to."""
        self.asked = asked
        """Whether that send went behind ``ASKING`` (the importing node)."""
        self.pending = False
        """Answered with a redirect, and not sent again yet."""


class SlotOrder:
    """Each slot's writes in flight, in the order they first left."""

    def __init__(self) -> None:
        self._writes: dict[int, dict[int, Flight]] = {}
        self._numbers = itertools.count()
        self._changed: dict[int, asyncio.Event] = {}

    def blocked(self, slot: int, node: str, own: Flight | None) -> asyncio.Event | None:
        """Whether a write of ``slot`` (``own``: its flight, if it left before)
        must wait before it is sent to ``node``: the event set once one of the
        slot's earlier writes changes, or None when it may go."""
        writes = self._writes.get(slot)
        if writes is None:
            return None
        for flight in writes.values():
            if flight is own:
                return None
            if flight.pending or (flight.node != node and not flight.asked):
                changed = self._changed.get(slot)
                if changed is None:
                    changed = self._changed[slot] = asyncio.Event()
                return changed
        return None

    def sent(self, slot: int, node: str, asked: bool, own: Flight | None) -> Flight:
        """A write of ``slot`` went to ``node``; its flight (``own``, if it left
        before and was sent again)."""
        if own is None:
            own = Flight(next(self._numbers), node, asked)
            writes = self._writes.get(slot)
            if writes is None:
                self._writes[slot] = {own.number: own}
            else:
                writes[own.number] = own
            return own
        own.node, own.asked, own.pending = node, asked, False
        self._wake(slot)
        return own

    def redirected(self, flight: Flight) -> None:
        """``flight`` was answered with a redirect: it is to be sent again."""
        flight.pending = True

    def done(self, slot: int, flight: Flight) -> None:
        """``flight`` was answered (or will never be sent again)."""
        writes = self._writes[slot]
        del writes[flight.number]
        if not writes:
            del self._writes[slot]
        self._wake(slot)

    def _wake(self, slot: int) -> None:
        if self._changed:
            changed = self._changed.pop(slot, None)
            if changed is not None:
                changed.set()

    def in_flight(self, slot: int) -> list[tuple[str, bool, bool]]:
        """The slot's writes, in order: (node, asked, pending). For tests."""
        return [(f.node, f.asked, f.pending) for f in self._writes.get(slot, {}).values()]
