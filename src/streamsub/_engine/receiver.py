"""The receiver: one subscriber's parts, put together, started and stopped.

Data flows one way::

    reader ─┐                  intake ─▶ inventory ─▶ dispatcher ─▶ settler ─▶ backend
    reclaimer┘ (entries)      (messages)  (flow, leases)  (handler tasks)  (acks, nacks,
                                                                           dead letters)
    leaser ◀── inventory's lease book
    Message ── ack()/nack() ──▶ settler (the Settling protocol, thread-safe)

Only this file knows every part. Each part survives Redis going away (it logs,
backs off and tries again); an unexpected error in one is logged and the part
restarted; a subscription or topic that is gone stops the receiver with that
error, which :meth:`Receiver.wait` raises.

Stopping, in order, all within ``shutdown_timeout`` plus :data:`SHUTDOWN_MARGIN`:
reads and sweeps end (one at the server finishes, at most a read's block);
messages read but not started go back without a delivery counted; handlers get
``shutdown_timeout`` to finish while their leases are still extended (and stay
extended until the flush ends, for acks still on their way); those
still running are cancelled and their messages given back; then the settler
flushes every ack, nack and dead letter for up to :data:`FLUSH_TIMEOUT` (less if
the reads took long to end, so the whole stays in the bound); what cannot be
sent is logged, and those messages are delivered again later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Literal

from .. import metrics
from .._backends.base import Backend, Reclaimed, SubscriptionRecord, TopicRecord
from .._core.flow import FlowStatistics, Grant
from .._errors import NotFoundError, StreamsubError
from .._message import Message
from .._settings import FlowControl, RetryPolicy
from . import ownership
from ._inventory import Counters, Inventory
from ._retrying import supervise
from .dispatcher import DEFAULT_HANDLER_THREADS, Dispatcher, Handler
from .intake import Intake
from .leaser import Leaser
from .ownership import Assignment, PartitionOwner
from .reader import READ_BLOCK_MS, Reader
from .reclaimer import Reclaimer
from .settler import Settler

__all__ = [
    "FLUSH_TIMEOUT",
    "SHUTDOWN_MARGIN",
    "AckMode",
    "Handler",
    "Receiver",
    "ReceiverStatistics",
]

log = logging.getLogger("streamsub")

AckMode = Literal["auto", "manual"]

READERS = 2
"""Reads in flight at once: one is parsed and handled while Redis serves the other.
An ordered subscription has one: the replies of two reads of one partition may
be taken in either order, and a key's later message would run first."""
READ_SHARE = 3
"""Each read reserves at most a third of max_messages, so that while reads wait
on an idle server the reclaimer still finds room at once (a nack due now is
swept without waiting for a read's block to end)."""
MAX_READ = 1_000
"""Messages one read asks for at most, over all its partitions (a third of
``max_messages`` up to this), as Kafka's ``max.poll.records`` bounds a poll: a
huge ``max_messages`` over a deep backlog read it in one reply, which held the
server while it was built and the client's memory at once."""
FLUSH_TIMEOUT = 3.0
"""Seconds the settler has to send what is queued when the subscriber stops."""
_CLEANUP = 0.25
"""Seconds kept for what follows the flush (cancelling, closing the pool)."""
SHUTDOWN_MARGIN = READ_BLOCK_MS / 1000 + 1.0 + FLUSH_TIMEOUT
"""What stopping may take beyond ``shutdown_timeout``: a read or sweep at the
server finishing (its block, plus a second), and the final flush."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReceiverStatistics:
    """A snapshot of one subscriber's counters."""

    received: int
    """Messages read as new."""
    reclaimed: int
    """Messages taken over after they sat idle for the ack deadline."""
    acked: int
    nacked: int
    dead_lettered: int
    lost: int
    """Entries that were pending but trimmed before anyone acked them."""
    handler_errors: int
    running: int
    """Handlers running now."""
    flow: FlowStatistics
    held_for_order: int = 0
    """Messages held until the one before them of their ordering key is settled
    (ordered subscriptions)."""
    partitions: tuple[int, ...] = ()
    """The partitions this subscriber reads now (on an ordered subscription,
    those it owns and has taken over)."""
    owned: dict[int, int] = dataclasses.field(default_factory=dict)
    """Ordered subscriptions: the partitions this subscriber owns, and their
    fencing tokens."""
    expired: int = 0
    """Messages whose handler ran past their lease (``max_lease_duration`` or
    ``modify_ack_deadline``): given up, to be delivered again."""


class Receiver:
    """Streams one subscription to a handler until stopped or failed."""

    def __init__(
        self,
        *,
        backend: Backend,
        topic: TopicRecord,
        subscription: SubscriptionRecord,
        dead_letter_topic: TopicRecord | None,
        handler: Handler,
        flow_control: FlowControl,
        ack_mode: AckMode,
        consumer: str,
        consumer_expiry: float,
        shutdown_timeout: float,
        handler_threads: int = DEFAULT_HANDLER_THREADS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        settings = subscription.settings
        ack_deadline = float(settings["ack_deadline"])  # type: ignore[arg-type]
        max_attempts = int(settings["max_delivery_attempts"])  # type: ignore[call-overload]
        retry = settings.get("retry_policy")
        self._group = subscription.name
        self._auto_ack = ack_mode == "auto"
        self._shutdown_timeout = shutdown_timeout
        self._counters = Counters()
        ordered = bool(settings.get("enable_message_ordering"))
        self._inventory = Inventory(
            flow_control,
            ack_deadline=ack_deadline,
            max_lease_duration=flow_control.max_lease_duration,
            clock=clock,
            ordered=ordered,
        )
        common: dict[str, Any] = {
            "backend": backend,
            "topic": topic,
            "group": subscription.name,
            "consumer": consumer,
            "inventory": self._inventory,
        }
        everything = () if ordered else range(topic.partitions)
        self._assignment = Assignment(everything, clock=clock)
        self._reclaimer = Reclaimer(
            **common,
            assignment=self._assignment,
            counters=self._counters,
            deliver=self._deliver_reclaimed,
            ack_deadline=ack_deadline,
            max_attempts=max_attempts if dead_letter_topic is not None else 0,
            consumer_expiry=consumer_expiry,
            clock=clock,
            tokens=self._owned_tokens if ordered else None,
            fenced=self._fenced,
            leaving=self._handing_over,
        )
        self._settler = Settler(
            **common,
            counters=self._counters,
            ack_deadline=ack_deadline,
            max_attempts=max_attempts,
            retry=RetryPolicy(**retry) if isinstance(retry, dict) else None,
            exactly_once=bool(settings.get("enable_exactly_once_delivery")),
            dead_letter_topic=dead_letter_topic,
            on_nacked=self._reclaimer.wake_in,
            checked_acks=ordered,
        )
        self._intake = Intake(
            topic=topic.name,
            group=subscription.name,
            inventory=self._inventory,
            settler=self._settler,
            counters=self._counters,
            max_attempts=max_attempts,
            has_dead_letter_topic=dead_letter_topic is not None,
            wall_clock=wall_clock,
            fencing=self._token if ordered else None,
            handing_over=self._handing_over if ordered else None,
        )
        self._dispatcher = Dispatcher(
            handler,
            done=self._handled,
            handled=self._returned,
            subscription=subscription.name,
            threads=handler_threads,
            alive=self._alive,
        )
        self._inventory.connect(self._start if ordered else self._dispatcher.start)
        share = min(MAX_READ, max(1, -(-flow_control.max_messages // READ_SHARE)))
        self._readers = [
            Reader(
                **common,
                assignment=self._assignment,
                deliver=self._intake.read,
                share=share,
                first_partition=i * topic.partitions // READERS,
                recover=self._reclaimer.recover if ordered else None,
                tokens=self._owned_tokens if ordered else None,
                fenced=self._fenced,
            )
            for i in range(1 if ordered else READERS)
        ]
        self._leaser = Leaser(**common, counters=self._counters)
        self._owner: PartitionOwner | None = None
        if ordered:
            self._owner = PartitionOwner(
                backend=backend,
                topic=topic,
                group=subscription.name,
                consumer=consumer,
                assignment=self._assignment,
                busy=self._busy,
                take_over=self._reclaimer.take_over,
                hand_over=self._hand_over,
                clock=clock,
                lease=ownership.OWNERSHIP_LEASE,
            )
        self._own_task: asyncio.Task[None] | None = None
        self._read_tasks: list[asyncio.Task[None]] = []
        self._reclaim_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._settle_task: asyncio.Task[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._error: NotFoundError | None = None
        self._unwatch: Callable[[], None] = _nothing

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start reading."""
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()

        def task(what: str, run: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
            return loop.create_task(
                supervise(f"{what} for {self._group!r}", run, fatal=self._fatal)
            )

        self._unwatch = metrics.watch_in_flight(
            self._group, lambda: self._inventory.flow.statistics().outstanding_messages
        )
        self._settle_task = task("settling", self._settler.run)
        self._lease_task = task("extending leases", self._leaser.run)
        self._reclaim_task = task("reclaiming", self._reclaimer.run)
        self._read_tasks = [task("reading", reader.run) for reader in self._readers]
        if self._owner is not None:
            self._own_task = task("owning partitions", self._owner.run)

    def _fatal(self, exc: NotFoundError) -> None:
        if self._error is not None:
            return
        self._error = exc
        log.error("streamsub: subscriber of %r stops: %s", self._group, exc)
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(
                self._stop(self._shutdown_timeout)
            )

    async def stop(self, timeout: float | None = None) -> None:
        """Stop (see the module docstring); a second call waits for the first."""
        if self._stopping is None:
            wait = self._shutdown_timeout if timeout is None else timeout
            self._stopping = asyncio.get_running_loop().create_task(self._stop(wait))
        await asyncio.shield(self._stopping)

    async def wait(self) -> None:
        """Return once the receiver has stopped; raise the error that stopped it."""
        assert self._stopped is not None, "start() first"
        await asyncio.shield(self._stopped)

    @property
    def error(self) -> NotFoundError | None:
        """The error that stopped the receiver, if one did."""
        return self._error

    async def _stop(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._intake.stopping = True
        for reader in self._readers:
            reader.stop()
        self._reclaimer.stop()
        if self._owner is not None:
            self._owner.freeze()  # renewed until the handlers are done and acks sent
        self._assignment.close()
        parts = [*self._read_tasks, *([self._reclaim_task] if self._reclaim_task else [])]
        busy = [r.reading for r in self._readers] + [self._reclaimer.at_server]
        await self._end(parts, busy[: len(parts)])
        for message in self._inventory.drain_hold():
            self._settler.release(message)
        await self._dispatcher.drain(started + timeout - loop.time())
        for message in self._inventory.messages():
            self._settler.release(message)
        self._settler.close()
        if self._settle_task is not None:
            # FLUSH_TIMEOUT, or less when ending the reads took long on a short
            # timeout: the whole stop stays within timeout + SHUTDOWN_MARGIN.
            bound = started + timeout + SHUTDOWN_MARGIN - _CLEANUP
            flush = max(0.0, min(FLUSH_TIMEOUT, bound - loop.time()))
            done, _ = await asyncio.wait({self._settle_task}, timeout=flush)
            if not done:
                self._settle_task.cancel()
                await asyncio.gather(self._settle_task, return_exceptions=True)
                dropped = self._settler.abandon()
                if dropped:
                    log.error(
                        "streamsub: subscriber of %r stopped with %d acks, nacks or dead "
                        "letters unsent (Redis did not answer); those messages will be "
                        "delivered again",
                        self._group,
                        dropped,
                    )
        if self._owner is not None:
            await self._leave(started + timeout + SHUTDOWN_MARGIN - _CLEANUP - loop.time())
        # Leases last until the flush is over: an ack still on its way keeps its
        # message from every other subscriber.
        if self._lease_task is not None:
            self._lease_task.cancel()
            await asyncio.gather(self._lease_task, return_exceptions=True)
        self._dispatcher.close()
        self._unwatch()
        assert self._stopped is not None
        if not self._stopped.done():
            if self._error is not None:
                self._stopped.set_exception(self._error)
                self._stopped.exception()  # retrieved by wait(), or nobody
            else:
                self._stopped.set_result(None)

    @staticmethod
    async def _end(tasks: list[asyncio.Task[None]], at_server: list[bool]) -> None:
        """End ``tasks`` together: one waiting on the server may finish (at most a
        read's block and a second); one waiting on anything else is cancelled now."""
        for task, busy in zip(tasks, at_server, strict=True):
            if not busy:
                task.cancel()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=READ_BLOCK_MS / 1000 + 1.0)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _leave(self, bound: float) -> None:
        """Hand the partitions over at once (else they move when the lease ends)."""
        assert self._owner is not None
        self._owner.stop()
        if self._own_task is not None:
            self._own_task.cancel()
            await asyncio.gather(self._own_task, return_exceptions=True)
        try:
            await asyncio.wait_for(self._owner.leave(), max(0.1, bound))
        except (TimeoutError, StreamsubError) as exc:
            log.warning(
                "streamsub: subscriber of %r could not hand its partitions over (%r); "
                "they move when its lease ends",
                self._group,
                exc,
            )

    def _busy(self, partition: int) -> bool:
        """Whether a message of ``partition`` is held, entries of it are being given
        back, or a read or sweep of it is at the server (a partition is handed
        over only when not)."""
        return (
            self._inventory.holds(partition)
            or self._settler.giving_back(partition)
            or any(partition in reader.partitions_read for reader in self._readers)
            or self._reclaimer.sweeping(partition)
        )

    def _handing_over(self) -> AbstractSet[int]:
        return self._owner.handing_back if self._owner is not None else frozenset()

    def statistics(self) -> ReceiverStatistics:
        """A snapshot of the counters."""
        c = self._counters
        return ReceiverStatistics(
            received=c.received,
            reclaimed=c.reclaimed,
            acked=c.acked,
            nacked=c.nacked,
            dead_lettered=c.dead_lettered,
            lost=c.lost,
            handler_errors=c.handler_errors,
            running=self._dispatcher.running,
            flow=self._inventory.flow.statistics(),
            held_for_order=order.waiting if (order := self._inventory.order) else 0,
            partitions=tuple(self._assignment.partitions),
            owned=self._owner.surely_owned() if self._owner is not None else {},
            expired=c.expired,
        )

    # --- between the parts -------------------------------------------------------
    def _hand_over(self, partitions: list[int]) -> None:
        """Partitions are being handed over: give back what waits there unstarted."""
        for message in self._inventory.take_waiting(partitions):
            self._settler.release(message)

    def _owned_tokens(self) -> dict[int, int]:
        """The partitions surely ours now, with their fencing tokens: reads and
        sweeps name no other."""
        return self._owner.surely_owned() if self._owner is not None else {}

    def _fenced(self, partitions: list[int]) -> None:
        if self._owner is not None:
            self._owner.fenced_out(partitions)

    def _alive(self) -> bool:
        """Whether handlers may start: not stopping, and the settler (which every
        handled message needs) neither cancelled nor ended, as it is when code
        stops every task (asyncio.run's teardown, a SIGTERM handler)."""
        task = self._settle_task
        return (
            not self._intake.stopping
            and task is not None
            and not task.done()
            and not task.cancelling()
        )

    def _token(self, partition: int) -> int:
        return self._owner.owned.get(partition, 0) if self._owner is not None else 0

    def _start(self, messages: list[Message]) -> None:
        """Start handlers on an ordered subscription, but only for messages taken
        under their partition's current fencing token while it surely holds: the
        others (the partition was lost, maybe owned again since) go back unseen;
        their new owner has taken them over."""
        owner = self._owner
        assert owner is not None
        while messages:
            run: list[Message] = []
            fenced: list[Message] = []
            for message in messages:  # one check per message, read once
                (run if owner.owns(message._partition, message._token) else fenced).append(message)
            self._dispatcher.start(run)
            messages = []
            for message in fenced:  # each may let another start: no recursion
                messages += self._settler.withdraw(message)

    def _deliver_reclaimed(self, items: Sequence[Reclaimed], grant: Grant) -> None:
        self._intake.reclaimed(items, grant)

    def _returned(self, messages: list[Message]) -> None:
        """Handlers returned: with auto-ack, their messages are acked."""
        if self._auto_ack:
            self._settler.ack_returned(messages)

    def _handled(self, message: Message, error: BaseException | None) -> None:
        if error is None:
            if self._auto_ack:
                self._settler.ack(message)
            return
        self._counters.handler_errors += 1
        log.warning(
            "streamsub: handler failed for message %s of %r (attempt %d): %r",
            message.message_id,
            self._group,
            message.delivery_attempt,
            error,
        )
        self._settler.nack_failed(message, error)


def _nothing() -> None:
    """Nothing to undo."""
