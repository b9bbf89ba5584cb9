"""The subscriber's flow controller: how much may be read and run now.

A message is *outstanding* from the moment it is read until it is acked,
nacked, dead-lettered or released. Reads in flight reserve their share of
``max_messages`` minus what is outstanding, so together they never ask for
more. A read over P partitions asks at least one per partition, so when fewer
than P slots are free up to P-1 more may be read; and the reclaimer may take
free slots that an idle, blocked read holds. Such extras wait on hold: the
limit that always holds exactly is the one on running handlers. A read message
starts (its handler runs) only while
fewer than ``max_messages`` run and its bytes fit under ``max_bytes``; one that
does not fit waits on hold, in arrival order. A message larger than
``max_bytes`` starts once nothing else runs, so it cannot stall the
subscription.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Generic, TypeVar

from .._settings import FlowControl

__all__ = ["FlowController", "FlowStatistics"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class FlowStatistics:
    """A snapshot of the flow controller."""

    outstanding_messages: int
    running_messages: int
    running_bytes: int
    on_hold: int


class FlowController(Generic[T]):
    """Counts outstanding messages and bytes; holds messages that do not fit."""

    __slots__ = (
        "_hold",
        "_max_bytes",
        "_max_messages",
        "_outstanding",
        "_reserved",
        "_running",
        "_running_bytes",
    )

    def __init__(self, settings: FlowControl) -> None:
        self._max_messages = settings.max_messages
        self._max_bytes = settings.max_bytes
        self._outstanding = 0
        self._reserved = 0
        self._running = 0
        self._running_bytes = 0
        self._hold: collections.deque[tuple[T, int]] = collections.deque()

    def read_budget(self) -> int:
        """How many messages a read may ask for now."""
        return self._max_messages - self._outstanding - self._reserved

    def free(self) -> int:
        """Slots not taken by outstanding messages, reservations aside: what the
        reclaimer may take while reads wait on an idle server."""
        return self._max_messages - self._outstanding

    def reserve(self, wanted: int) -> int:
        """Set aside up to ``wanted`` of the budget for a read about to be sent, so
        that reads in flight together never ask for more than the budget."""
        granted = max(0, min(wanted, self.read_budget()))
        self._reserved += granted
        return granted

    def received(self, items: list[tuple[T, int]], *, reserved: int = 0) -> list[T]:
        """Count read messages (item, size) as outstanding, releasing the read's
        reservation; return those that start now."""
        self._reserved -= reserved
        self._outstanding += len(items)
        if not self._hold:  # the usual case: all of them fit, start them as they are
            running = self._running + len(items)
            running_bytes = self._running_bytes + sum(size for _, size in items)
            if running <= self._max_messages and (
                running_bytes <= self._max_bytes or running == len(items) == 1
            ):
                self._running, self._running_bytes = running, running_bytes
                return [item for item, _ in items]
        self._hold.extend(items)
        return self._admit()

    def finished(self, size: int, *, started: bool = True) -> list[T]:
        """One outstanding message of ``size`` is done; return messages that start now."""
        self._outstanding -= 1
        if started:
            self._running -= 1
            self._running_bytes -= size
        if not self._hold:
            return []
        return self._admit()

    def unreserve(self, reserved: int) -> None:
        """Give back a reservation whose read failed."""
        self._reserved -= reserved

    def drain_hold(self) -> list[T]:
        """Take every message on hold (to release them at shutdown); they stay outstanding."""
        items = [item for item, _ in self._hold]
        self._hold.clear()
        return items

    def statistics(self) -> FlowStatistics:
        """A snapshot of the counts."""
        return FlowStatistics(
            self._outstanding, self._running, self._running_bytes, len(self._hold)
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
