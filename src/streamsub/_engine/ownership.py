"""Which partitions a subscriber reads, and, on ordered subscriptions, owns.

An unordered subscription's subscribers all read every partition (the most
throughput). On an ordered subscription each partition is owned by one
subscriber at a time, as a Kafka consumer group assigns them: members renew a
lease in Redis every third of :data:`OWNERSHIP_LEASE`; the rights are sticky
(each member is due an even share and keeps what it owns up to it, see
``own.lua``), so a join moves only the newcomer's share and a leave or crash
only the leaver's; and every new owner of a partition gets a larger fencing
token.

- **Join**: the members that hold a newcomer's partitions stop reading them,
  give back the messages of them that have not started (waiting for their key's
  turn, maybe behind a nack's backoff), let the running ones finish, then
  release them (cooperative); the newcomer takes them at its next heartbeat,
  taking over everything pending there first, parked nacks included. Messages
  published there meanwhile wait for the move, so it goes no slower than it
  must: a partition is released as soon as nothing of it is held (not at the
  next heartbeat), and a member whose partitions are still another's
  heartbeats every 50 ms for a while (the time the owner takes to see the
  join, and a drain), so it takes them within that of their release.
- **Crash**: a member that stops renewing loses its partitions when its lease
  expires; their new owner first takes over every entry still pending in them
  (their delivery counted again), so a crashed subscriber's in-flight message
  runs before any later message of its key, and only then reads new entries.
- **Leave**: a stopping subscriber releases its partitions once its acks are
  sent, so they move at once.
- **Lost contact**: a member whose lease may have run out (it could not renew,
  or its process stalled) reads, sweeps and starts nothing of its partitions
  until a renewal says which are still its own: the fencing is local, by the
  clock, checked before every read, sweep and handler start, so a member that
  wakes from a stall longer than its lease never acts on a partition another
  now owns. Each message carries the fencing token its partition had
  when it was taken, and starts only while that token is still ours: messages
  of a partition lost meanwhile (and maybe owned again since, under a new
  token) are given back unseen (their delivery not counted) for the owner
  that took them over. A handler already running finishes, but its ack or
  nack settles nothing once the new owner has taken the message over
  (settling checks the delivery).
- **Reads are fenced in Redis.** A new owner raises each partition's fence
  (``Backend.fence``: a key in the partition's slot) to its token before it
  takes anything over there, and the reader reads only through
  ``Backend.read_owned``, which serves a partition only while its fence holds
  the reader's token, atomically at the server: a read that arrives after the
  partition moved on (held in the network, sent by a stalled owner) takes
  nothing, and reports the partition fenced; the stale owner gives it up
  (:meth:`PartitionOwner.fenced_out`). A fence holding a larger token at take
  time means the same. The reclaimer's sweeps (the take-over's too) are fenced
  as reads are.
- **Seek**: a snapshot seek that makes entries pending again raises the fence
  of their partition (in the step that moves the position back), so its owner
  is fenced out and the partition's next owner takes them over before reading
  the entries after the position. Sweeps leave alone entries pending above the
  position (a seek back leaves them there): a read delivers them again, in
  order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from collections.abc import Set as AbstractSet

from .._backends.base import Backend, TopicRecord
from .._errors import NotFoundError, StreamsubError, UnavailableError
from ._retrying import Backoff, raise_if_cancelled

__all__ = ["OWNERSHIP_LEASE", "Assignment", "PartitionOwner"]

log = logging.getLogger("streamsub")

OWNERSHIP_LEASE = 10.0
"""Seconds a partition stays with a member that stopped renewing (crashed)."""
_BUSY_INTERVAL = 0.5
"""Seconds between heartbeats while partitions are being handed over."""
_RELEASE_POLL = 0.02
"""How often a member handing partitions over checks (locally, no I/O) whether
one is free to release: it releases it then, not at its next heartbeat, since
messages published there wait for the move."""
_WAITING_INTERVAL = 0.05
"""Seconds between heartbeats while partitions that are this member's by right
are still another's, for up to :data:`_WAITING_FAST_FOR` after they became due
(the time their owner's next heartbeat may take to see the join, plus a
drain): the newcomer takes a released partition within this, not up to a
:data:`_BUSY_INTERVAL` later, while its messages wait."""
_WAITING_FAST_FOR = OWNERSHIP_LEASE / 3 + 1.0


class Assignment:
    """The partitions this subscriber reads, and those it sweeps, now."""

    def __init__(
        self, partitions: Iterable[int], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._partitions = sorted(partitions)
        self._swept = list(self._partitions)
        self._clock = clock
        self._valid_until = math.inf
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def partitions(self) -> list[int]:
        """Read for new entries (none once the assignment has expired)."""
        return self._partitions if self._clock() < self._valid_until else []

    @property
    def swept(self) -> list[int]:
        """Swept for idle and due entries (none once the assignment has expired)."""
        return self._swept if self._clock() < self._valid_until else []

    def set(
        self,
        partitions: Iterable[int],
        swept: Iterable[int] | None = None,
        *,
        valid_until: float = math.inf,
    ) -> None:
        """Read ``partitions`` and sweep ``swept`` (default: the same) until the
        clock reaches ``valid_until``, when both become empty."""
        self._partitions = sorted(partitions)
        self._swept = sorted(swept) if swept is not None else list(self._partitions)
        self._valid_until = valid_until
        self._changed.set()

    def close(self) -> None:
        """Wake whoever waits for partitions (the subscriber stops)."""
        self._closed = True
        self._changed.set()

    async def wait(self) -> None:
        """Return once there is a partition to read, or the subscriber stops."""
        while not self.partitions and not self._closed:
            self._changed.clear()
            await self._changed.wait()


class PartitionOwner:
    """Keeps this member's partitions of an ordered subscription."""

    def __init__(
        self,
        *,
        backend: Backend,
        topic: TopicRecord,
        group: str,
        consumer: str,
        assignment: Assignment,
        busy: Callable[[int], bool],
        take_over: Callable[[list[int]], Awaitable[list[int]]],
        hand_over: Callable[[list[int]], None] = lambda partitions: None,
        clock: Callable[[], float],
        lease: float = OWNERSHIP_LEASE,
    ) -> None:
        self._backend = backend
        self._topic = topic
        self._group = group
        self._consumer = consumer
        self._busy = busy
        self._hand_over = hand_over
        self._assignment = assignment
        self._take_over = take_over
        self._clock = clock
        self._lease = lease
        self.owned: dict[int, int] = {}
        """Partition -> fencing token, as of the last heartbeat."""
        self._valid_until = 0.0
        """Until when ``owned`` is surely still ours: a third of a lease before it
        may have run out, counted from the start of the last renewal."""
        self._handing_back: set[int] = set()
        self._waiting_since: float | None = None
        """When partitions due to this member began to wait for their owner."""
        self._taking: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._frozen = False
        self._instance = secrets.token_hex(8)
        """Tells this subscriber from another that uses the same consumer name."""
        self._claimed = False
        self.fenced = False
        """Another subscriber took this consumer name over: this one owns nothing."""

    def freeze(self) -> None:
        """The subscriber stops: keep renewing what it owns while its handlers
        finish (so nothing moves under them), take nothing new; :meth:`leave`
        follows."""
        self._frozen = True
        for task in self._tasks:
            task.cancel()

    def stop(self) -> None:
        """Renew no more."""
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()

    @property
    def handing_back(self) -> AbstractSet[int]:
        """Partitions being handed over: neither read nor swept, what arrives from
        them goes back (a view, not a copy)."""
        return self._handing_back

    def surely_owned(self) -> dict[int, int]:
        """The partitions (and tokens) surely ours now: none once the lease may
        have run out, until a renewal says again."""
        return dict(self.owned) if self._clock() < self._valid_until else {}

    def owns(self, partition: int, token: int) -> bool:
        """Whether ``partition`` is surely ours now, under fencing ``token`` (see the
        module docstring)."""
        return (
            token != 0 and self.owned.get(partition) == token and self._clock() < self._valid_until
        )

    async def run(self) -> None:
        errors = Backoff()
        while not self._stopping:
            raise_if_cancelled()
            release = [] if self._frozen else [p for p in self._handing_back if not self._busy(p)]
            started = self._clock()
            try:
                # A renewal that takes until our leases may have run out counts as
                # failed: reading stops then, not a socket timeout later.
                result = await asyncio.wait_for(
                    self._backend.own_partitions(
                        self._topic,
                        self._group,
                        self._consumer,
                        int(self._lease * 1000),
                        release=release,
                        take=not self._frozen,
                        instance=self._instance,
                        claim=not self._claimed,
                    ),
                    max(self._lease / 3, self._valid_until - started),
                )
            except NotFoundError:
                raise
            except (StreamsubError, TimeoutError) as exc:
                if self._stopping:
                    return
                if isinstance(exc, TimeoutError):
                    exc = UnavailableError(
                        f"Redis did not answer the lease renewal within "
                        f"{max(self._lease / 3, self._valid_until - started):.1f} s; "
                        "this subscriber stops reading its partitions once its lease may "
                        "have run out: check the network to Redis and the server's load"
                    )
                if self._clock() >= self._valid_until:  # our leases may have run out
                    self._assignment.set([], swept=[])
                await errors.wait("keeping partition ownership", exc)
                continue
            errors.reset()
            self._claimed = True
            if result.fenced:
                self._fence()
                return
            # Not renewed for a lease, a partition is another's: stop reading a
            # third of a lease before that.
            self._valid_until = started + self._lease * 2 / 3
            if release:
                log.info("streamsub: handed partitions %s of %r over", sorted(release), self._group)
            lost = set(self.owned) - set(result.owned) - set(release)
            if lost:
                log.warning(
                    "streamsub: subscriber %r lost partitions %s of %r (it did not renew "
                    "its lease in time); it stops reading them and gives back what it "
                    "holds of them and has not started",
                    self._consumer,
                    sorted(lost),
                    self._group,
                )
                self._hand_over(sorted(lost))
            handing_back = (self._handing_back - set(release)) | set(result.hand_back)
            if handing_back - self._handing_back:
                # What waits there goes back now, for the new owner to take over in
                # order: a key blocked on a long backoff must not hold the move.
                self._hand_over(sorted(handing_back - self._handing_back))
            self._handing_back = handing_back
            # New: not owned before, or owned again under a new token (lost while
            # renewals failed, then given back to us): either way, what is pending
            # there is taken over before anything is read.
            new = [
                p
                for p, token in result.owned.items()
                if self.owned.get(p) != token and p not in self._taking
            ]
            self.owned = dict(result.owned)
            self._handing_back &= set(self.owned)
            self._taking &= set(self.owned)
            if new:
                log.info(
                    "streamsub: subscriber %r owns partitions %s of %r",
                    self._consumer,
                    new,
                    self._group,
                )
                self._taking.update(new)
                task = asyncio.get_running_loop().create_task(self._take(new))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            self._assign()
            interval = self._lease / 3
            # Released partitions (handed over, or given up when fenced out by a
            # seek) are taken by their rightful member's next heartbeat: ours
            # comes soon, in case that is us.
            if result.waiting or self._handing_back or release:
                interval = min(interval, _BUSY_INTERVAL)
            if not result.waiting:
                self._waiting_since = None
            elif self._waiting_since is None:
                self._waiting_since = started
            if (
                self._waiting_since is not None
                and started - self._waiting_since < _WAITING_FAST_FOR
            ):
                interval = min(interval, _WAITING_INTERVAL)
            await self._pause(interval)

    async def _pause(self, interval: float) -> None:
        """Wait ``interval`` seconds until the next heartbeat, or less: until woken
        (:meth:`stop`, :meth:`fenced_out`), or until a partition being handed
        over is free to release (its messages wait for the move)."""
        self._wake.clear()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + interval
        while True:
            step = deadline - loop.time()
            if self._handing_back and not self._frozen and not self._stopping:
                if any(not self._busy(p) for p in self._handing_back):
                    return
                step = min(step, _RELEASE_POLL)
            if step <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), step)
            if self._wake.is_set():
                return

    def _fence(self) -> None:
        """Another subscriber took our consumer name over: own nothing, for good."""
        log.error(
            "streamsub: another subscriber of %r started with consumer name %r and took "
            "its partitions over; this one reads nothing more. Give each subscriber of "
            "an ordered subscription its own consumer name (the default is unique)",
            self._group,
            self._consumer,
        )
        self.fenced = True
        self._hand_over(sorted(self.owned))
        self.owned = {}
        self._valid_until = 0.0
        for task in self._tasks:
            task.cancel()
        self._assignment.set([], valid_until=0.0)

    def fenced_out(self, partitions: list[int]) -> None:
        """Redis refused to serve ``partitions`` under our tokens: their fences hold
        a newer owner's. Stop reading them, give back what waits there, and
        release them at the next heartbeat (the renewal decides who owns them
        next, under a new token)."""
        mine = [p for p in partitions if p in self.owned and p not in self._handing_back]
        if not mine:
            return
        log.warning(
            "streamsub: subscriber %r found partitions %s of %r fenced by a newer owner; "
            "it gives them up",
            self._consumer,
            mine,
            self._group,
        )
        self._handing_back.update(mine)
        self._hand_over(mine)
        self._assign()
        self._wake.set()

    async def _take(self, partitions: list[int]) -> None:
        """Raise the partitions' fences to our tokens, take over what is pending in
        them, then read them (not before: a later message of a key must not
        overtake a pending one)."""
        errors = Backoff()
        left = partitions
        while not self._stopping:
            try:
                tokens = {p: self.owned[p] for p in left if p in self.owned}
                stale = await self._backend.fence(self._topic, self._group, tokens)
                if stale:
                    self.fenced_out(sorted(stale))
                left = [p for p in left if p in tokens and p not in stale]
                # A sweep cut short (our lease may have run out meanwhile) is
                # done again once a renewal says the partitions are still ours.
                left = [p for p in await self._take_over(left) if p in self.owned]
                if not left:
                    break
                await self._renewed(left)
            except NotFoundError:
                return  # the subscription is gone: the reader says so
            except StreamsubError as exc:
                await errors.wait("taking over partitions", exc)
        self._taking.difference_update(partitions)
        self._assign()

    async def _renewed(self, partitions: list[int]) -> None:
        """Wait until ``partitions`` are surely ours again, or none of them is ours."""
        while not self._stopping:
            owned = self.surely_owned()
            if any(p in owned for p in partitions) or not any(p in self.owned for p in partitions):
                return
            await asyncio.sleep(self._lease / 10)

    def _assign(self) -> None:
        # Partitions being handed over are neither read nor swept: what waits or
        # comes back there (a nack) is the new owner's to take over, in order.
        kept = set(self.owned) - self._taking - self._handing_back
        self._assignment.set(kept, valid_until=self._valid_until)

    async def leave(self) -> None:
        """Release every partition and the membership (acks are sent by now)."""
        if not self.fenced:
            with contextlib.suppress(NotFoundError):  # deleted: nothing to release
                await self._backend.own_partitions(
                    self._topic,
                    self._group,
                    self._consumer,
                    int(self._lease * 1000),
                    leave=True,
                    instance=self._instance,
                )
        self.owned = {}
