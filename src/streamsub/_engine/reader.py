"""The reader: XREADGROUP ``>`` over a subscription's partitions.

A read asks for no more than the flow-control budget it reserved: it asks each
partition for an equal share, blocking for at most a second on an idle server
(a finite block, so a lost connection or a stop is noticed soon). With fewer
messages free than there are partitions it polls that many partitions at a
time without blocking, taking turns so none starves; once a whole round found
nothing it blocks on every partition asking one each, which can bring up to
one per partition when several receive in the same instant (those wait on hold,
counted in flow control). Several readers may
run at once, each with its own reservation: one is parsed and handled while
the server serves the other.

On an ordered subscription a read that fails with its outcome unknown (a
timeout, a reset) may have been run by the server, its entries now pending for
this subscriber unseen: before it reads those partitions again, the reader
takes back everything pending there (``recover``), so that no later message of
their keys overtakes them. Its reads are fenced (``Backend.read_owned``): Redis
serves a partition only under the fencing token its owner holds now, so a read
that arrives after the partition moved on (held in the network, sent by a
stalled subscriber) takes nothing; the partitions it names are ``fenced``: the
owner gives them up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from .._backends.base import Backend, Entry, TopicRecord
from .._core.flow import Grant
from .._errors import NotFoundError, StreamsubError
from ._inventory import Inventory
from ._retrying import Backoff, raise_if_cancelled
from .ownership import Assignment

__all__ = ["READ_BLOCK_MS", "Reader"]

READ_BLOCK_MS = 1000
"""How long a read waits on an idle server: short, so a stop ends it soon."""


class Reader:
    """Reads new entries for one consumer and hands them to ``deliver``."""

    def __init__(
        self,
        *,
        backend: Backend,
        topic: TopicRecord,
        group: str,
        consumer: str,
        inventory: Inventory,
        assignment: Assignment,
        deliver: Callable[[list[Entry], Grant], None],
        share: int,
        first_partition: int = 0,
        recover: Callable[[list[int]], Awaitable[None]] | None = None,
        tokens: Callable[[], Mapping[int, int]] | None = None,
        fenced: Callable[[list[int]], None] = lambda partitions: None,
    ) -> None:
        self._backend = backend
        self._topic = topic
        self._group = group
        self._consumer = consumer
        self._inventory = inventory
        self._deliver = deliver
        self._share = share
        self._assignment = assignment
        self._next = first_partition
        self._polled_empty = 0
        """Partitions polled without finding anything since the last entry."""
        self._recover = recover
        self._tokens = tokens
        self._fenced = fenced
        self._unknown: set[int] = set()
        """Partitions of failed reads whose entries may be pending here unseen."""
        self._stopping = False
        self.reading = False
        """True while a read is at the server (stop lets it finish, not cancels it)."""
        self.partitions_read: frozenset[int] = frozenset()
        """The partitions of the read at the server."""

    def stop(self) -> None:
        """Send no more reads."""
        self._stopping = True

    def _plan(self, wanted: int) -> tuple[list[int], int, int | None]:
        """Which partitions to read, how many entries to ask each for, and how long
        to block (None: answer at once)."""
        partitions = self._assignment.partitions
        total = len(partitions)
        if wanted >= total:
            return list(partitions), wanted // total, READ_BLOCK_MS
        if self._polled_empty >= total:
            self._polled_empty = 0
            return list(partitions), 1, READ_BLOCK_MS
        first = self._next % total
        self._next = (first + wanted) % total
        self._polled_empty += wanted
        return [partitions[(first + i) % total] for i in range(wanted)], 1, None

    async def run(self) -> None:
        errors = Backoff()
        inventory = self._inventory
        while not self._stopping:
            raise_if_cancelled()
            await self._assignment.wait()  # on an ordered subscription: until it owns some
            if self._unknown:
                assert self._recover is not None
                unknown = sorted(self._unknown)
                try:
                    await self._recover(unknown)
                except StreamsubError as exc:
                    if isinstance(exc, NotFoundError):
                        raise
                    await errors.wait("taking back what a failed read delivered", exc)
                    continue
                self._unknown.difference_update(unknown)
            grant = await inventory.reserve(self._share)
            if self._stopping or not self._assignment.partitions:
                inventory.unreserve(grant)
                continue
            partitions, count, block_ms = self._plan(grant.messages)
            self.reading = True
            self.partitions_read = frozenset(partitions)
            try:
                entries = await self._read(partitions, count, block_ms)
            except BaseException as exc:
                self.reading = False
                self.partitions_read = frozenset()
                inventory.unreserve(grant)
                if not isinstance(exc, StreamsubError) or isinstance(exc, NotFoundError):
                    raise  # NotFoundError: the subscription is gone, for good
                if self._stopping:
                    return
                if self._recover is not None:
                    self._unknown.update(partitions)
                await errors.wait("reading", exc)
                continue
            self.reading = False
            self.partitions_read = frozenset()
            errors.reset()
            if entries:
                self._polled_empty = 0
                self._deliver(entries, grant)
            else:
                inventory.unreserve(grant)

    async def _read(self, partitions: list[int], count: int, block_ms: int | None) -> list[Entry]:
        if self._tokens is None:
            return await self._backend.read(
                self._topic, self._group, self._consumer, partitions, count, block_ms
            )
        owned = self._tokens()
        tokens = {p: owned[p] for p in partitions if p in owned}
        if not tokens:
            return []
        read = await self._backend.read_owned(
            self._topic, self._group, self._consumer, tokens, count, block_ms
        )
        if read.fenced:
            self._fenced(sorted(read.fenced))
        return read.entries
