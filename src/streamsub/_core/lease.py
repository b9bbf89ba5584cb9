"""The lease book: which received messages this subscriber still holds.

Every message handed to a handler is leased until it is settled (acked,
nacked, dead-lettered) or its lease ends. A lease ends ``max_lease_duration``
after receipt, or at the time ``modify_ack_deadline`` set. While it lasts, the
engine resets the entry's idle time every ``extend_interval`` so no other
subscriber's reclaimer (which takes entries idle for the ack deadline) takes it.
The times are exact, not guessed from an ack-latency histogram as Pub/Sub's
clients do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["LeaseBook", "LeaseDue"]

K = TypeVar("K", bound=Hashable)

_EXTEND_FRACTION = 1 / 3
"""Extend three times per ack deadline: two extensions may be late before it lapses."""


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseDue(Generic[K]):
    """What the leaser must do now."""

    extend: list[K]
    """Leases to extend: reset their idle time now."""
    expired: list[K]
    """Leases that ended: stop extending; another subscriber may take them."""


class LeaseBook(Generic[K]):
    """Lease ends per message, and which leases need extending when."""

    __slots__ = ("_ends", "_limits", "ack_deadline", "max_lease_duration")

    def __init__(self, *, ack_deadline: float, max_lease_duration: float) -> None:
        self.ack_deadline = ack_deadline
        self.max_lease_duration = max_lease_duration
        self._ends: dict[K, float] = {}
        self._limits: dict[K, float] = {}
        """Receipt + max_lease_duration, kept only for leases whose end was moved."""

    def __len__(self) -> int:
        return len(self._ends)

    def __contains__(self, key: object) -> bool:
        return key in self._ends

    @property
    def extend_interval(self) -> float:
        """How often leases are extended."""
        return self.ack_deadline * _EXTEND_FRACTION

    def add(self, key: K, now: float) -> None:
        """A message was received at ``now``: lease it for up to max_lease_duration."""
        self._ends[key] = now + self.max_lease_duration

    def add_many(self, keys: list[K], now: float) -> None:
        """Messages were received at ``now``: lease each (as :meth:`add`)."""
        end = now + self.max_lease_duration
        self._ends.update(dict.fromkeys(keys, end))

    def set_deadline(self, key: K, now: float, seconds: float) -> bool:
        """End ``key``'s lease ``seconds`` from now, at most max_lease_duration after
        receipt; return False if the lease is not held."""
        end = self._ends.get(key)
        if end is None:
            return False
        limit = self._limits.setdefault(key, end)
        self._ends[key] = min(limit, now + seconds)
        return True

    def remove(self, key: K) -> bool:
        """The message was settled; return whether it was held."""
        if self._limits:
            self._limits.pop(key, None)
        return self._ends.pop(key, None) is not None

    def remove_many(self, keys: list[K]) -> None:
        """These messages were settled (as :meth:`remove` each)."""
        ends, limits = self._ends, self._limits
        for key in keys:
            ends.pop(key, None)
        if limits:
            for key in keys:
                limits.pop(key, None)

    def due(self, now: float) -> LeaseDue[K]:
        """Split the held leases into those to extend now and those that ended."""
        extend: list[K] = []
        expired: list[K] = []
        for key, end in self._ends.items():
            (expired if end <= now else extend).append(key)
        for key in expired:
            del self._ends[key]
            self._limits.pop(key, None)
        return LeaseDue(extend, expired)
