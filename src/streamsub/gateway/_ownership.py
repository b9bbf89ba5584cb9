"""One gateway process's share of an ordered subscription's partitions.

Every gateway process that serves an ordered subscription (a stream, or a unary
Pull) is one member of the subscription's partition ownership, the same
leases in Redis the native ordered receiver keeps (``_engine.ownership``): a
partition is owned by one member at a time, with a fencing token, renewed
every third of :data:`OWNERSHIP_LEASE`. Within the process its streams split
the owned partitions among themselves (see ``Adapter.partitions_for``), so one
partition is read by one stream of one gateway at a time.

- **Join**: a gateway that gets its first stream of the subscription becomes a
  member; the members holding its partitions by right stop reading them, wait
  until their deliveries of them are acked, nacked or lapsed, then release
  them (cooperative hand-back).
- **Take-over**: a newly owned partition is first swept whole (every pending
  entry, whatever its idle time, parked nacks included) by the stream that
  reads it, which delivers those entries before any new one of the partition:
  a crashed gateway's in-flight messages come back before later messages of
  their keys.
- **Crash**: a gateway that stops renewing loses its partitions when its lease
  ends; the others take them over as above.
- **Leave**: a stopping gateway gives its leases back first, then releases its
  partitions at once. A gateway whose last stream of the subscription closed
  stays a member while its deliveries of it are out (their client may still
  ack them), then leaves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .._backends.base import Backend, TopicRecord
from .._engine._retrying import raise_if_cancelled
from .._engine.ownership import OWNERSHIP_LEASE, Assignment, PartitionOwner
from .._errors import NotFoundError, StreamsubError
from ._tasks import end_task

__all__ = ["OWNERSHIP_LEASE", "Membership"]

log = logging.getLogger("streamsub.gateway")

_RESTART_AFTER = 1.0
"""Seconds before a heartbeat loop that failed is started again."""


class Membership:
    """This process as one member of an ordered subscription's ownership."""

    def __init__(
        self,
        backend: Backend,
        topic: TopicRecord,
        group: str,
        member: str,
        *,
        busy: Callable[[int], bool],
        clock: Callable[[], float],
        lease: float = OWNERSHIP_LEASE,
    ) -> None:
        self.group = group
        self.member = member
        self.assignment = Assignment(())
        self.taking: dict[int, str] = {}
        """Newly owned partitions still being swept whole: partition -> cursor."""
        self._backend = backend
        self._topic = topic
        self._busy = busy
        self._clock = clock
        self._lease = lease
        self._owner = self._new_owner()
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(self._run())

    def _new_owner(self) -> PartitionOwner:
        return PartitionOwner(
            backend=self._backend,
            topic=self._topic,
            group=self.group,
            consumer=self.member,
            assignment=self.assignment,
            busy=self._busy,
            take_over=self._take_over,
            clock=self._clock,
            lease=self._lease,
        )

    @property
    def partitions(self) -> list[int]:
        """The partitions this process reads now (owned, not being handed back)."""
        return self.assignment.partitions

    @property
    def owned(self) -> dict[int, int]:
        """Partition -> fencing token, of the partitions surely ours now (none once
        the lease may have run out, until a renewal says again)."""
        return self._owner.surely_owned()

    def fenced_out(self, partitions: list[int]) -> None:
        """Redis refused to serve ``partitions`` under our tokens: give them up."""
        self._owner.fenced_out(partitions)

    async def _take_over(self, partitions: list[int]) -> list[int]:
        # The sweep is the readers' (within their flow control), not done here:
        # a partition is read only once its sweep is over.
        for partition in partitions:
            self.taking[partition] = "-"
        return []

    def swept(self, partition: int, cursor: str) -> None:
        """The take-over sweep of ``partition`` went on to ``cursor`` ("0-0": done)."""
        if cursor == "0-0":
            self.taking.pop(partition, None)
        elif partition in self.taking:
            self.taking[partition] = cursor

    async def _run(self) -> None:
        while True:
            try:
                await self._owner.run()
                return
            except asyncio.CancelledError:
                raise
            except NotFoundError:
                return  # the subscription is gone; its streams say so
            except Exception as exc:  # a bug: log it, keep the gateway serving
                raise_if_cancelled()  # a stop request swallowed inside a Redis call
                log.warning(
                    "streamsub gateway: keeping partition ownership of %r failed (%s); "
                    "starting again",
                    self.group,
                    exc,
                )
                self.assignment.set([], swept=[])
                self.taking.clear()
                await asyncio.sleep(_RESTART_AFTER)
                self._owner = self._new_owner()

    async def leave(self) -> None:
        """Stop renewing and release every partition and the membership."""
        self._owner.stop()
        task, self._task = self._task, None
        if task is not None:
            await end_task(task, f"the partition ownership of {self.group!r}")
        self.assignment.set([], swept=[])
        self.taking.clear()
        try:
            await self._owner.leave()
        except StreamsubError as exc:
            log.warning(
                "streamsub gateway: could not release the partitions of %r (%s); they move "
                "when the lease ends",
                self.group,
                exc,
            )
