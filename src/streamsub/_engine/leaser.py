"""The leaser: keeps the messages in hand from going idle.

Three times per ack deadline it resets the idle time of every held message
whose lease has not ended (owner-checked, so a message another subscriber has
taken meanwhile is dropped from the book, never taken back). A message whose
handler runs past its lease is given up (``Inventory.expire``). It keeps
running while handlers finish at shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from .._backends.base import Backend, TopicRecord
from .._errors import NotFoundError, StreamsubError
from ._inventory import Counters, Inventory
from ._retrying import raise_if_cancelled

__all__ = ["Leaser"]

log = logging.getLogger("streamsub")


class Leaser:
    """Extends the leases the inventory's lease book says are due."""

    def __init__(
        self,
        *,
        backend: Backend,
        topic: TopicRecord,
        group: str,
        consumer: str,
        inventory: Inventory,
        counters: Counters,
    ) -> None:
        self._backend = backend
        self._topic = topic
        self._group = group
        self._consumer = consumer
        self._inventory = inventory
        self._counters = counters

    async def run(self) -> None:
        leases = self._inventory.leases
        while True:
            await asyncio.sleep(leases.extend_interval)
            await self.extend_due()
            raise_if_cancelled()

    async def extend_due(self) -> None:
        """Extend every lease that is due; forget those that ended or were lost."""
        leases = self._inventory.leases
        due = leases.due(self._inventory.now())
        for key in due.expired:
            if self._inventory.expire(key) is None:
                continue  # settled meanwhile, or still waiting to start (leased anew)
            self._counters.expired += 1
            log.warning(
                "streamsub: the handler of message %s-%s of %r ran past its lease "
                "(max_lease_duration or modify_ack_deadline); the message is given up "
                "and will be delivered again, and its ack or nack will settle nothing",
                *key,
                self._group,
            )
        if not due.extend:
            return
        ids: dict[int, list[str]] = collections.defaultdict(list)
        for partition, entry_id in due.extend:
            ids[partition].append(entry_id)
        try:
            owned = await self._backend.extend(self._topic, self._group, self._consumer, ids)
        except NotFoundError:
            raise
        except StreamsubError as exc:
            raise_if_cancelled()
            log.warning("streamsub: extending leases failed: %s", exc)
            return
        settling = self._inventory.settling
        for partition, entry_ids in ids.items():
            still = set(owned.get(partition, ()))
            for entry_id in entry_ids:
                key = (partition, entry_id)
                if entry_id in still or key not in leases:
                    continue
                if key in settling:  # acked meanwhile: done, not lost
                    continue
                log.warning(
                    "streamsub: message %s-%s of %r was taken by another subscriber "
                    "while its handler ran (lease lost)",
                    partition,
                    entry_id,
                    self._group,
                )
                leases.remove(key)
