"""The publisher's closed batches waiting for their writes to start: one line
per node, and each partition's writes in the order they were queued.

On Redis Cluster a batch is written as one write per master it spans, and each
master has its own writes in flight (``MAX_IN_FLIGHT``): a master that is down
holds back its own line, not the others'. A write may start when its node has
room, no failure holds one of its partitions back, and it is the first write
still waiting for each of its partitions (a partition's slot can move to
another master between two batches: its writes still start in order); one
that may not start holds back the later writes to its partitions, not the
rest of its line. On one server there is one line (node ``None``).

No I/O: the publisher starts what :meth:`WriteQueue.take` hands out.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Generic, TypeAlias, TypeVar

__all__ = ["WriteQueue"]

T = TypeVar("T")


_Waiting: TypeAlias = tuple[int, tuple[int, ...], T]
"""A waiting write: its serial (queue order), its partitions, its item. A
plain tuple: one is made per write, on the publisher's path."""


class WriteQueue(Generic[T]):
    """Writes waiting to start, in lines per node (see the module docstring)."""

    __slots__ = ("_lines", "_serial", "_waiting", "count")

    def __init__(self) -> None:
        self._lines: dict[str | None, collections.deque[_Waiting[T]]] = {}
        self._waiting: dict[int, collections.deque[int]] = {}
        """Per partition, the serials of the writes waiting for it, in order."""
        self._serial = 0
        self.count = 0
        """The writes waiting (an attribute, not ``len``: read on every step
        of the publisher's flusher)."""

    def __len__(self) -> int:
        return self.count

    def add(self, node: str | None, partitions: Iterable[int], item: T, serial: int = 0) -> None:
        """Queue ``item``, a write to ``partitions`` on ``node``, behind the
        others (or, given its ``serial``, in its place of queue order)."""
        if not serial:
            self._serial += 1
            serial = self._serial
        line = self._lines.get(node)
        if line is None:
            line = self._lines[node] = collections.deque()
        partitions = tuple(partitions)
        line.append((serial, partitions, item))
        waiting = self._waiting
        for partition in partitions:
            queue = waiting.get(partition)
            if queue is None:
                queue = waiting[partition] = collections.deque()
            queue.append(serial)
        self.count += 1

    def take(
        self, busy: Mapping[str | None, int], limit: int, held: Container[int] = ()
    ) -> list[T]:
        """Take the writes that may start now, in queue order: each of a node
        with fewer than ``limit`` writes in flight (``busy``, counting those
        taken here), none of its partitions ``held``, and first in line for
        each of its partitions. A write that may not start holds back the later
        writes to its partitions, not the rest of its node's line."""
        taken: list[_Waiting[T]] = []
        starting: dict[str | None, int] = {}
        waiting = self._waiting
        lines = self._lines
        progress = True
        while progress:  # a write taken may put another node's write first in line
            progress = False
            for node, line in lines.items():
                room = limit - busy.get(node, 0) - starting.get(node, 0)
                i = 0
                while room > 0 and i < len(line):
                    entry = line[i]
                    serial, partitions, _ = entry
                    for p in partitions:
                        if p in held or waiting[p][0] != serial:
                            break
                    else:
                        del line[i]
                        for p in partitions:
                            waiting[p].popleft()
                        taken.append(entry)
                        room -= 1
                        starting[node] = starting.get(node, 0) + 1
                        progress = True
                        continue
                    i += 1
            if len(lines) == 1:  # one server: no other line to put first
                break
        if not taken:
            return []
        self.count -= len(taken)
        if len(taken) > 1:
            taken.sort()
        return [entry[2] for entry in taken]

    def rebuild(self, keep: Callable[[T], tuple[str | None, Iterable[int], T] | None]) -> None:
        """Replace each waiting write by what ``keep`` makes of it (its node,
        partitions and item; None drops it), in queue order."""
        entries = sorted(entry for line in self._lines.values() for entry in line)
        self._lines = {}
        self._waiting = {}
        self.count = 0
        for entry in entries:
            kept = keep(entry[2])
            if kept is not None:
                node, partitions, item = kept
                self.add(node, partitions, item, entry[0])

    def items(self) -> list[T]:
        """The waiting writes, in queue order."""
        return [entry[2] for entry in sorted(e for line in self._lines.values() for e in line)]
