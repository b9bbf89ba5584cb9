"""The order of a partition's writes while its cluster slot moves (no I/O).

The cluster appender (``_cluster.py``) sends a partition's writes in order,
several in flight on one connection. When the slot moves, each write comes
back ``MOVED`` (or ``ASK``) and is sent again to the new node, and a new write
goes there directly once the appender's map names it. Redis keeps the order of
one connection's commands, not of the calls that handle their replies: a write
sent again, or a new one, could reach the new node before an earlier write
still on its way back from the old one (a publisher's link then refuses it:
``BROKENLINK``, and its publish fails). :class:`WriteOrder` keeps each
partition's writes (by stream key) in the order they first left, and says when
one may go to a node: when every earlier write of its partition is in flight
at that node (answered in order behind it), or was sent behind ``ASKING`` from
that node (a write to the migrating slot's source comes back ``ASK`` too and
follows it), and none waits to be sent again. Only a partition's own writes
hold it back: its order is what a publish promises (and what its links check).
(The appender's queue of first sends is per slot: while a write is held back,
later writes to its slot queue behind it.)
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable


class Flight:
    """One write of a partition, from its first send until it is answered (or
    given up)."""

    __slots__ = ("asked_from", "node", "number", "pending")

    def __init__(self, number: int, node: str) -> None:
        self.number = number
        """Its place among the partition's writes: the order they first left."""
        self.node = node
        """The node it was last sent to."""
        self.asked_from: str | None = None
        """When that send went behind ``ASKING``: the node that answered ``ASK``
        (the migrating slot's source)."""
        self.pending = False
        """Answered with a redirect (or ``TRYAGAIN``), not sent again yet."""


class WriteOrder:
    """Each partition's writes in flight, in the order they first left."""

    def __init__(self) -> None:
        self._writes: dict[Hashable, dict[int, Flight]] = {}
        self._numbers = itertools.count()
        self._changed: dict[Hashable, asyncio.Event] = {}

    def blocked(self, stream: Hashable, node: str, own: Flight | None) -> asyncio.Event | None:
        """Whether a write to ``stream`` (``own``: its flight, if it left
        before) must wait before it goes to ``node``: the event set once one of
        the partition's earlier writes goes on or is answered; None when it may
        go now."""
        writes = self._writes.get(stream)
        if writes is None:
            return None
        for flight in writes.values():
            if flight is own:
                return None
            if flight.pending or (flight.node != node and flight.asked_from != node):
                changed = self._changed.get(stream)
                if changed is None:
                    changed = self._changed[stream] = asyncio.Event()
                return changed
        return None

    def sent(self, stream: Hashable, node: str, asking: bool, own: Flight | None) -> Flight:
        """A write to ``stream`` went to ``node`` (behind ``ASKING``, or not);
        its flight (``own``, if it left before and was sent again)."""
        if own is None:
            own = Flight(next(self._numbers), node)
            writes = self._writes.get(stream)
            if writes is None:
                self._writes[stream] = {own.number: own}
            else:
                writes[own.number] = own
            return own
        if not asking:
            own.asked_from = None
        elif own.asked_from is None or own.node != node:  # sent on by ASK, not TRYAGAIN
            own.asked_from = own.node
        own.node, own.pending = node, False
        self._wake(stream)
        return own

    def redirected(self, flight: Flight) -> None:
        """``flight`` was answered with a redirect: it is to be sent again."""
        flight.pending = True

    def done(self, stream: Hashable, flight: Flight) -> None:
        """``flight`` was answered (or will never be sent again)."""
        writes = self._writes[stream]
        del writes[flight.number]
        if not writes:
            del self._writes[stream]
        self._wake(stream)

    def _wake(self, stream: Hashable) -> None:
        if self._changed:
            changed = self._changed.pop(stream, None)
            if changed is not None:
                changed.set()

    def in_flight(self, stream: Hashable | None = None) -> list[tuple[str, str | None, bool]]:
        """The writes of ``stream`` (of every partition: None), in order: (node,
        the node that answered ``ASK``, pending). For tests."""
        streams = [stream] if stream is not None else list(self._writes)
        return [
            (f.node, f.asked_from, f.pending)
            for s in streams
            for f in self._writes.get(s, {}).values()
        ]
