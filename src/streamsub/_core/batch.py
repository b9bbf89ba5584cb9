"""The publisher's batch: messages wait here until one write takes them all.

A batch closes when it is full (``BatchSettings``' message count or bytes), or
when it is due (:meth:`Batcher.due`): at once while the writer is free, that is
while fewer than ``free_below`` writes are in flight, else when its oldest
message has waited ``max_latency``. A write in flight is the batching window:
a lone publish goes out at once, and batches grow only while earlier ones are
on their way; the time limit is a ceiling, never a floor. It groups messages by
partition, since a write is one script call per partition.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .._settings import BatchSettings

__all__ = ["Batch", "Batcher"]

T = TypeVar("T")

Batch = dict[int, list[tuple[bytes, T]]]
"""Partition -> its messages in publish order, each as (packed message, token)."""


class Batcher(Generic[T]):
    """Collects messages into one open batch; the caller takes it when it closes."""

    __slots__ = ("_bytes", "_count", "_free_below", "_open", "_opened_at", "_settings")

    def __init__(self, settings: BatchSettings, *, free_below: int = 1) -> None:
        if free_below < 1:
            raise ValueError(f"free_below must be at least 1, got {free_below}")
        self._settings = settings
        self._free_below = free_below
        self._open: Batch[T] = {}
        self._count = 0
        self._bytes = 0
        self._opened_at = 0.0

    def __len__(self) -> int:
        return self._count

    def would_overflow(self, size: int) -> bool:
        """Whether adding ``size`` bytes would push a non-empty batch past max_bytes."""
        return self._count > 0 and self._bytes + size > self._settings.max_bytes

    def add(self, partition: int, packed: bytes, size: int, token: T, now: float) -> bool:
        """Add a message; return True when the batch is full and must be taken now."""
        if self._count == 0:
            self._opened_at = now
        messages = self._open.get(partition)
        if messages is None:
            self._open[partition] = [(packed, token)]
        else:
            messages.append((packed, token))
        self._count += 1
        self._bytes += size
        settings = self._settings
        return self._count >= settings.max_messages or self._bytes >= settings.max_bytes

    def deadline(self) -> float | None:
        """When the open batch must be taken at the latest, however busy the
        writer (None when empty)."""
        if self._count == 0:
            return None
        return self._opened_at + self._settings.max_latency

    def due(self, writes_in_flight: int) -> float | None:
        """When the open batch is to be taken, given the writes now in flight:
        None when it is empty; the time of its first message (so, already due)
        while the writer is free (fewer than ``free_below`` writes in flight);
        else its :meth:`deadline`, until a write comes back and frees the writer.
        """
        if self._count == 0:
            return None
        if writes_in_flight < self._free_below:
            return self._opened_at
        return self._opened_at + self._settings.max_latency

    def take(self) -> Batch[T]:
        """Close the open batch and return it; a new one opens on the next add."""
        batch = self._open
        self._open = {}
        self._count = 0
        self._bytes = 0
        return batch
