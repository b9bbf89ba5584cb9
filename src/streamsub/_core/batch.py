"""The publisher's batch: messages wait here until one write takes them all.

A batch closes when it is full (``BatchSettings``' message count or bytes), or
when it is due (:meth:`Batcher.due`): at once while the writer is free, that is
while fewer than ``free_below`` writes are in flight, else when its oldest
message has waited ``max_latency``. A write in flight is the batching window:
a lone publish goes out at once, and batches grow only while earlier ones are
on their way; the time limit is a ceiling, never a floor. It groups messages by
partition, since a write is one script call per partition.

Many callers at once (a crowd of ``publish()`` callers, each awaiting its
single message): a batch that held all of them would leave Redis idle while
the callers prepare the next one, and the callers idle while Redis stores it.
So once the publisher has seen at least ``2 * split_at`` single publishes
outstanding (queued or being written) in its last rounds of writes
(:attr:`Batcher.concurrency`, from ``_core/crowd.py``), a batch is also full
when its single publishes (``add(..., lone=True)``) reach half of that, and a
batch holding the other half (half of it rounded down, and at least
``split_at``) goes out while one write is in flight: the crowd is written in
halves, Redis storing one while the callers of the other publish again
(Kafka's several batches in flight per broker). A ``publish_many`` is one
caller however many messages it has: its messages count toward neither. On
Redis Cluster the crowd is the whole topic's, and each half is then written
as one write per master.

Single publishes of data alone (no ordering key, no attributes: most
publishes) wait in the batch's lane (:meth:`Batcher.add_data`), their data as it
is beside the waiter of each, rather than as an entry apiece: such a publish
costs one append here. The lane becomes one entry of its partition (made by the
owner's ``lane`` function: a run of messages, written as one) before anything
else joins that partition, before a publish for another partition joins the
lane, and as the batch is taken, so each partition's entries stay in publish
order. Lane publishes close the batch as they would as entries: the lane is
bookkeeping, not a rule.

An entry may stand for a run of messages (``count`` of them, packed one after
the other): a ``publish_many`` of messages without ordering keys joins the
batch in as few entries as the batch limits allow (:meth:`Batcher.fitting`),
so its Python cost per message is its encoding, not the batch's bookkeeping.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Generic, TypeVar

from .._settings import BatchSettings

__all__ = ["Batch", "Batcher"]

T = TypeVar("T")
W = TypeVar("W")

Batch = dict[int, list[tuple[bytes, T]]]
"""Partition -> its messages in publish order, each entry as (packed message or
run of messages, token)."""


class Batcher(Generic[T, W]):
    """Collects messages into one open batch; the caller takes it when it closes.
    ``T``: an entry's token; ``W``: a lane publish's waiter."""

    __slots__ = (
        "_bytes",
        "_count",
        "_crowd_from",
        "_datas",
        "_free_below",
        "_lane_entry",
        "_lane_partition",
        "_lone",
        "_max_bytes",
        "_max_messages",
        "_open",
        "_opened_at",
        "_settings",
        "_split_at",
        "_waiters",
        "concurrency",
        "room",
    )

    def __init__(
        self,
        settings: BatchSettings,
        *,
        free_below: int = 1,
        split_at: int = 0,
        lane: Callable[[list[bytes], list[W]], tuple[bytes, T]] | None = None,
    ) -> None:
        """``lane(datas, waiters)``: the entry a lane becomes (needed only by
        :meth:`add_data`)."""
        if free_below < 1:
            raise ValueError(f"free_below must be at least 1, got {free_below}")
        if split_at < 0:
            raise ValueError(f"split_at must not be negative, got {split_at}")
        self._settings = settings
        self._max_messages = settings.max_messages
        self._max_bytes = settings.max_bytes
        self._free_below = free_below
        self._split_at = split_at
        self._crowd_from = 2 * split_at if split_at else sys.maxsize
        """The least :attr:`concurrency` that is a crowd worth two writes."""
        self.concurrency = 0
        """Single publishes outstanding at the publisher's recent peak (the owner
        sets it): from ``2 * split_at`` on, a batch is full when its single
        publishes reach half of it. 0 (or a ``split_at`` of 0): batches are
        never split for a crowd."""
        self.room = sys.maxsize
        """The bytes a message may have without overflowing the open batch (set
        by the batcher alone; :meth:`would_overflow` asks it, and a hot path may
        read it instead): any message fits an empty batch."""
        self._open: Batch[T] = {}
        self._lane_entry = lane
        self._lane_partition = 0
        self._datas: list[bytes] = []
        self._waiters: list[W] = []
        self._count = 0
        self._lone = 0
        self._bytes = 0
        self._opened_at = 0.0

    def __len__(self) -> int:
        return self._count

    @property
    def partitions(self) -> Iterable[int]:
        """The partitions the open batch holds messages for."""
        if self._waiters and self._lane_partition not in self._open:
            return [*self._open, self._lane_partition]
        return self._open.keys()

    def would_overflow(self, size: int) -> bool:
        """Whether adding ``size`` bytes would push a non-empty batch past max_bytes."""
        return size > self.room

    @property
    def size(self) -> int:
        """The open batch's bytes."""
        return self._bytes

    @property
    def lone(self) -> int:
        """The single publishes in the open batch."""
        return self._lone

    def add(
        self,
        partition: int,
        packed: bytes,
        size: int,
        token: T,
        now: float,
        count: int = 1,
        *,
        lone: bool = False,
    ) -> bool:
        """Add a message (or a run of ``count`` messages of ``size`` bytes in all,
        packed one after the other: as many as :meth:`fitting` said; ``lone``: a
        single publish, its caller's only message); return True when the batch
        is full and must be taken now: at the settings' limits, or when its
        single publishes reach half of a crowd (:attr:`concurrency`)."""
        # Locals and no calls: a single publish makes one add.
        if not self._count:
            self._opened_at = now
        elif self._waiters and partition == self._lane_partition:
            self._settle()  # the lane's publishes came first
        messages = self._open.get(partition)
        if messages is None:
            self._open[partition] = [(packed, token)]
        else:
            messages.append((packed, token))
        self._count = count = self._count + count
        self._bytes = size = self._bytes + size
        self.room = self._max_bytes - size
        if count >= self._max_messages or size >= self._max_bytes:
            self._lone += lone
            return True
        if not lone:
            return False
        self._lone = lone_count = self._lone + 1
        concurrency = self.concurrency
        return concurrency >= self._crowd_from and 2 * lone_count >= concurrency

    def add_data(self, partition: int, data: bytes, waiter: W, now: float) -> bool:
        """Add a single publish of data alone (its caller's only message, no
        ordering key, no attributes) for ``partition`` to the batch's lane,
        as it is, with its ``waiter``; return as :meth:`add` with ``lone=True``."""
        if self._lane_entry is None:
            raise TypeError("Batcher.add_data needs the lane's entry: Batcher(..., lane=...)")
        if not self._count:
            self._opened_at = now
            self._lane_partition = partition
        elif partition != self._lane_partition:
            if self._waiters:
                self._settle()  # a lane holds one partition's publishes
            self._lane_partition = partition
        self._datas.append(data)
        self._waiters.append(waiter)
        self._count = count = self._count + 1
        self._bytes = size = self._bytes + len(data)
        self.room = self._max_bytes - size
        self._lone = lone = self._lone + 1
        if count >= self._max_messages or size >= self._max_bytes:
            return True
        concurrency = self.concurrency
        return concurrency >= self._crowd_from and 2 * lone >= concurrency

    def _settle(self) -> None:
        """The lane, as one entry at the end of its partition's."""
        make = self._lane_entry
        assert make is not None  # add_data refuses a lane without it
        entry = make(self._datas, self._waiters)
        self._datas, self._waiters = [], []
        messages = self._open.get(self._lane_partition)
        if messages is None:
            self._open[self._lane_partition] = [entry]
        else:
            messages.append(entry)

    def _crowded(self) -> bool:
        """Whether the publisher's recent peak is a crowd worth two writes."""
        return self.concurrency >= self._crowd_from

    def fitting(self, sizes: Sequence[int], start: int, rest: int) -> int:
        """How many of the messages of ``sizes[start:]`` (``rest`` bytes in all)
        join the open batch as one run, by the rules that :meth:`would_overflow`
        and :meth:`add` apply one message at a time (a run is no single publish:
        the crowd rule does not apply): up to the message limit,
        and up to the one that makes the bytes reach ``max_bytes`` or the one
        before that which would go past it. 0 when the first would overflow a
        non-empty batch (take it first); at least 1 for an empty batch."""
        settings = self._settings
        room = min(settings.max_messages - self._count, len(sizes) - start)
        if self._bytes + rest < settings.max_bytes:
            return room  # the bytes cannot reach the limit: no need to look at each
        total, count, max_bytes = self._bytes, self._count, settings.max_bytes
        taken = 0
        for size in islice(sizes, start, start + room):
            if count and total + size > max_bytes:
                break
            total += size
            count += 1
            taken += 1
            if total >= max_bytes:
                break
        return taken

    def deadline(self) -> float | None:
        """When the open batch must be taken at the latest, however busy the
        writer (None when empty)."""
        if self._count == 0:
            return None
        return self._opened_at + self._settings.max_latency

    def due(self, writes_in_flight: int) -> float | None:
        """When the open batch is to be taken, given the writes now in flight:
        None when it is empty; the time of its first message (so, already due)
        while the writer is free (fewer than ``free_below`` writes in flight),
        or, in a crowd, while one write more is in flight and the batch holds
        the other half of it (half the crowd rounded down, at least
        ``split_at`` single publishes); else its :meth:`deadline`, until a
        write comes back and frees the writer.
        """
        if self._count == 0:
            return None
        if writes_in_flight < self._free_below or (
            writes_in_flight == self._free_below
            and self._lone >= max(self._split_at, self.concurrency // 2)
            and self._crowded()
        ):
            return self._opened_at
        return self._opened_at + self._settings.max_latency

    def take(self) -> Batch[T]:
        """Close the open batch and return it; a new one opens on the next add."""
        if self._waiters:
            self._settle()
        batch = self._open
        self._open = {}
        self._count = 0
        self._lone = 0
        self._bytes = 0
        self.room = sys.maxsize
        return batch
