"""The intake: turns entries that reads and reclaims return into messages.

Decodable entries become :class:`Message` objects held in the inventory (which
starts those that fit); entries streamsub did not write go to the dead-letter
topic, or are nacked when there is none; entries out of delivery attempts are
dead-lettered. The last two stay counted in flow control until the settler has
sent them, so a sweep over a long pending list cannot load it all into memory.
While the receiver stops, what arrives is given back without counting a
delivery; so is what arrives, on an ordered subscription, from a partition
being handed over (a read or sweep sent before the hand-over began): the
waiting messages of its keys went back when it began, so a later message of a
key must not start here ahead of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

from .. import metrics
from .._backends.base import Entry, Reclaimed
from .._core.codec import Decoded, UndecodableEntry, data_only, decode
from .._core.deadletter import UNDECODABLE
from .._core.flow import Grant
from .._message import Message
from ._inventory import Counters, Inventory
from .settler import Settler

__all__ = ["Intake"]

log = logging.getLogger("streamsub")


class Intake:
    """Entries in, held messages out."""

    def __init__(
        self,
        *,
        topic: str,
        group: str,
        inventory: Inventory,
        settler: Settler,
        counters: Counters,
        max_attempts: int,
        has_dead_letter_topic: bool,
        wall_clock: Callable[[], float],
        fencing: Callable[[int], int] | None = None,
        handing_over: Callable[[], Collection[int]] | None = None,
    ) -> None:
        self._topic = topic
        self._fencing = fencing
        """On an ordered subscription: a partition's fencing token now (0: not ours),
        which each message taken carries, so that it starts only while it holds."""
        self._handing_over = handing_over
        """On an ordered subscription: the partitions being handed over now, whose
        entries go back as they arrive."""
        self._group = group
        self._inventory = inventory
        self._settler = settler
        self._counters = counters
        self._max_attempts = max_attempts
        self._has_dead_letter_topic = has_dead_letter_topic
        self._wall_clock = wall_clock
        self.stopping = False

    def read(self, entries: list[Entry], grant: Grant) -> None:
        """New entries from a read."""
        self._counters.received += len(entries)
        self._take(entries, None, grant)

    def reclaimed(self, items: Sequence[Reclaimed], grant: Grant) -> None:
        """Entries a reclaim returned, lost ones already counted and left out."""
        self._counters.reclaimed += sum(1 for item in items if item.state == "deliver")
        self._take([item.entry for item in items], items, grant)

    def _take(
        self, entries: list[Entry], reclaimed: Sequence[Reclaimed] | None, grant: Grant
    ) -> None:
        if self.stopping:
            self._inventory.take([], grant, aside=self._give_back(entries, reclaimed))
            return
        aside: list[int] = []
        leaving = self._handing_over() if self._handing_over is not None else ()
        if leaving:
            kept = [i for i, entry in enumerate(entries) if entry.partition not in leaving]
            if len(kept) < len(entries):
                back = [i for i, entry in enumerate(entries) if entry.partition in leaving]
                aside = self._give_back(
                    [entries[i] for i in back],
                    [reclaimed[i] for i in back] if reclaimed is not None else None,
                )
                entries = [entries[i] for i in kept]
                if reclaimed is not None:
                    reclaimed = [reclaimed[i] for i in kept]
        delivered_ms = int(self._wall_clock() * 1000)
        settling, group = self._settler, self._group
        messages: list[Message] = []
        redelivered = 0
        for index, (partition, entry_id, fields, count) in enumerate(entries):
            # The receive path's tightest loop: a read's first delivery of the
            # common shape (data only) skips decode's tuple; positional arguments.
            data = data_only(fields) if reclaimed is None else None
            if data is not None and count == 1:
                message = Message(
                    data,
                    {},
                    None,
                    partition,
                    entry_id,
                    count,
                    group,
                    len(data),
                    delivered_ms,
                    settling,
                )
                messages.append(message)
                continue
            item = reclaimed[index] if reclaimed is not None else None
            try:
                decoded = decode(fields)
            except UndecodableEntry as exc:
                first = item.first_delivery_ms if item is not None else delivered_ms
                size = self._undecodable(entries[index], exc.reason, first, delivered_ms)
                if size is not None:
                    aside.append(size)
                continue
            if item is not None and item.state == "exhausted":
                aside.append(self._exhausted(item, decoded))
                continue
            redelivered += count > 1
            data, key, attributes, size = decoded
            message = Message(
                data,
                attributes,
                key,
                partition,
                entry_id,
                count,
                group,
                size,
                delivered_ms,
                settling,
            )
            messages.append(message)
        fencing = self._fencing
        if fencing is not None:
            for message in messages:
                message._token = fencing(message._partition)
        self._inventory.take(messages, grant, aside=aside)
        if messages:
            metrics.on_delivered(self._group, len(messages), redelivered=redelivered)

    def _give_back(self, entries: list[Entry], reclaimed: Sequence[Reclaimed] | None) -> list[int]:
        """Give back what arrives while stopping, or from a partition being handed
        over; return the sizes held aside (out of attempts: dead-lettered all the
        same)."""
        aside: list[int] = []
        for index, entry in enumerate(entries):
            item = reclaimed[index] if reclaimed is not None else None
            if item is not None and item.state == "exhausted":
                try:
                    decoded: Decoded | None = decode(entry.fields)
                except UndecodableEntry:
                    decoded = None
                aside.append(self._exhausted(item, decoded))
                continue
            self._settler.release_entries(entry.partition, [(entry.entry_id, entry.delivery_count)])
        return aside

    def _undecodable(self, entry: Entry, reason: str, first_ms: int, last_ms: int) -> int | None:
        """Dead-letter (return its size, held aside until sent) or nack (None)."""
        log.warning(
            "streamsub: entry %s-%s of topic %r is undecodable (%s)",
            entry.partition,
            entry.entry_id,
            self._topic,
            reason,
        )
        size = sum(len(field) for field in entry.fields)
        if self._has_dead_letter_topic:
            self._settler.dead_letter_entry(
                entry.partition,
                entry.entry_id,
                None,
                entry.fields,
                entry.delivery_count,
                f"{UNDECODABLE}: {reason}",
                first_ms,
                last_ms,
                aside=size,
            )
            return size
        self._settler.nack_entry(entry.partition, entry.entry_id, entry.delivery_count, last_ms)
        return None

    def _exhausted(self, item: Reclaimed, decoded: Decoded | None) -> int:
        entry = item.entry
        reason = f"max_delivery_attempts ({self._max_attempts}) reached"
        if decoded is None:
            reason = f"{UNDECODABLE}: not a streamsub message"
        size = sum(len(field) for field in entry.fields)
        self._settler.dead_letter_entry(
            entry.partition,
            entry.entry_id,
            decoded,
            entry.fields,
            entry.delivery_count,
            reason,
            item.first_delivery_ms,
            item.last_delivery_ms,
            aside=size,
        )
        self._inventory.unblock(entry.partition, entry.entry_id)
        return size
