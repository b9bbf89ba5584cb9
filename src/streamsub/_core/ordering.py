"""Per-key order on an ordered subscription: one message of a key at a time.

A key's messages live in one partition, where entry ids follow publish order.
The subscriber hands a key's next message to a handler only once the one
before it is settled:

- **acked or dead-lettered**: the key's next message (lowest entry id held)
  may start;
- **nacked or given back**: the key is *blocked* on that entry. Its later
  messages stay held (leased, and counted by flow control) until the entry is
  delivered again and settled for good, its backoff included, or until it is
  found settled elsewhere (:meth:`KeyOrder.unblock`).

Messages without an ordering key are not ordered and start at once. Keys are
independent: a slow or blocked key holds up only its own messages, but what
it holds counts against flow control, so a very hot or very slow key can fill
``max_messages`` and leave no room for others until it moves.

Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Generic, TypeVar

__all__ = ["KeyOrder", "Position", "position"]

T = TypeVar("T")

Position = tuple[int, int]
"""An entry id ``"<ms>-<seq>"`` as numbers, which sort in stream order."""


def position(entry_id: str) -> Position:
    """The stream position of ``entry_id``."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclasses.dataclass(slots=True)
class _Key(Generic[T]):
    running: Position | None = None
    blocked: Position | None = None
    waiting: list[tuple[Position, int]] = dataclasses.field(default_factory=list)
    """Positions and tickets of the held messages that wait, in stream order."""


class KeyOrder(Generic[T]):
    """Which held message of each ordering key may run now."""

    __slots__ = ("_items", "_keys", "_tickets")

    def __init__(self) -> None:
        self._keys: dict[str, _Key[T]] = {}
        self._items: dict[int, T] = {}
        self._tickets = 0

    @property
    def waiting(self) -> int:
        """Messages held back for order."""
        return len(self._items)

    def blocked_on(self, key: str) -> Position | None:
        """The entry ``key`` is blocked on, if it is."""
        state = self._keys.get(key)
        return None if state is None else state.blocked

    def blocked(self) -> dict[str, Position]:
        """Keys blocked on a nacked entry, and that entry."""
        return {key: s.blocked for key, s in self._keys.items() if s.blocked is not None}

    def offer(self, key: str, at: Position, item: T) -> bool:
        """A message of ``key`` at ``at`` arrived: True when it may run now, else it
        waits until :meth:`done` or :meth:`unblock` hands it out."""
        state = self._keys.get(key)
        if state is None:
            self._keys[key] = _Key(running=at)
            return True
        if state.running is None and (
            state.blocked == at  # the entry the key waits for is back
            or (state.blocked is None and (not state.waiting or at < state.waiting[0][0]))
        ):
            state.running, state.blocked = at, None
            return True
        self._tickets += 1
        self._items[self._tickets] = item
        bisect.insort(state.waiting, (at, self._tickets))
        return False

    def done(self, key: str, at: Position, *, settled: bool) -> list[T]:
        """The running message of ``key`` at ``at`` was acked or dead-lettered
        (``settled``), or nacked or given back (the key blocks on it). Return
        the message that may run next, if any."""
        state = self._keys.get(key)
        if state is None or state.running != at:
            return []
        state.running = None
        if not settled:
            state.blocked = at
        return self._next(key, state)

    def unblock(self, key: str, at: Position) -> list[T]:
        """The entry ``key`` is blocked on was settled without coming back here
        (dead-lettered out of attempts, or taken and settled by another
        subscriber). Return the message that may run next, if any."""
        state = self._keys.get(key)
        if state is None or state.blocked != at:
            return []
        state.blocked = None
        return self._next(key, state)

    def discard(self, key: str, at: Position) -> None:
        """A message of ``key`` at ``at`` that no handler saw is no longer held (given
        back, or replaced by a newer delivery). One that was next to run blocks
        the key until it is back."""
        state = self._keys.get(key)
        if state is None:
            return
        if state.running == at:
            state.running, state.blocked = None, at
            return
        for index, (where, ticket) in enumerate(state.waiting):
            if where == at:
                del state.waiting[index]
                self._items.pop(ticket, None)
                break
        if state.running is None and state.blocked is None and not state.waiting:
            del self._keys[key]

    def drain(self) -> list[T]:
        """Every waiting message (the subscriber stops and gives them back)."""
        items = list(self._items.values())
        self._items.clear()
        for state in self._keys.values():
            state.waiting.clear()
        return items

    def _next(self, key: str, state: _Key[T]) -> list[T]:
        if state.blocked is None and state.waiting:
            at, ticket = state.waiting.pop(0)
            state.running = at
            return [self._items.pop(ticket)]
        if state.blocked is None and state.running is None:
            del self._keys[key]
        return []
