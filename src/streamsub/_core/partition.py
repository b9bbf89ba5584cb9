"""Which partition a message goes to.

A keyed message goes to ``fnv1a_32(key) % partitions``, the same function as
Go's ``hash/fnv`` New32a, so services in other languages place keys alike.
Keyless messages are spread by a sticky round-robin: all keyless messages of one
batch go to one partition (one write), and each batch moves to the next.
"""

from __future__ import annotations

__all__ = ["StickyPartitioner", "fnv1a_32", "partition_for_key"]

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bits, over ``data``."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def partition_for_key(ordering_key: str, partitions: int) -> int:
    """The partition of a message with ``ordering_key`` (its UTF-8 bytes hashed)."""
    return fnv1a_32(ordering_key.encode()) % partitions


class StickyPartitioner:
    """Spreads keyless messages evenly, one partition per batch."""

    __slots__ = ("_partitions", "current")

    def __init__(self, partitions: int, *, start: int = 0) -> None:
        self._partitions = partitions
        self.current = start % partitions
        """The partition that keyless messages go to until the next
        :meth:`advance` (read it; an attribute, not a property: every single
        publish reads it)."""

    def advance(self) -> None:
        """Move on to the next partition (called when a batch is taken)."""
        self.current = (self.current + 1) % self._partitions
