"""The receiver: reads a subscription, runs handlers, settles and leases messages.

Four tasks share one flow controller and one lease book:

- the *reader* asks XREADGROUP for no more than the free flow-control slots,
  with a finite block, so it never holds more than it may run;
- the *settler* sends acks (many ids per partition per call), nacks and dead
  letters as they come, one round trip at a time, so they batch by themselves
  under load;
- the *leaser* resets the idle time of held messages three times per ack
  deadline, so no other subscriber's reclaimer takes a message still in hand;
- the *reclaimer* claims entries idle for the ack deadline (a crashed
  consumer's, or nacked ones whose backoff has passed) through the same flow
  control as new ones, and dead-letters those out of delivery attempts.

Each task survives Redis going away: it logs, backs off and tries again, and
an unexpected error in one is logged and the task restarted.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, TypeVar

from .._backends.base import Backend, Entry, Reclaimed, SubscriptionRecord, TopicRecord
from .._core.codec import Decoded, Encoded, UndecodableEntry, decode
from .._core.deadletter import UNDECODABLE, dead_letter_message
from .._core.flow import FlowController, FlowStatistics
from .._core.lease import LeaseBook
from .._core.partition import partition_for_key
from .._core.retry import backoff
from .._errors import AckError, AckStatus, FailedPreconditionError, StreamsubError
from .._message import Message
from .._settings import FlowControl, RetryPolicy
from ._eager import resume, start_eager

__all__ = ["AckMode", "Handler", "Receiver", "ReceiverStatistics"]

log = logging.getLogger("streamsub")

Handler = Callable[[Message], Awaitable[None]] | Callable[[Message], None]
AckMode = Literal["auto", "manual"]
_Key = tuple[int, str]
_Nack = tuple[str, int, int, bool]
"""(entry id, delay ms, delivery time ms, whether a handler saw it)."""
_T = TypeVar("_T")

_READ_BLOCK_MS = 1000
"""Finite, so a lost connection is noticed within a second."""
_ERROR_BACKOFF = (0.05, 2.0)
"""Retry a failed Redis call after 50 ms, doubling up to 2 s."""
_READERS = 2
"""Reads in flight at once, each for its share of the budget: one is parsed and
handled while Redis serves the other."""
_RECLAIM_BATCH = 100
"""Entries claimed per partition per call."""
_CONSUMER_SWEEP_EVERY = 60.0
"""Seconds between looks for idle, empty consumers to delete (or half the
consumer expiry, when that is shorter)."""


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
    flow: FlowStatistics


@dataclasses.dataclass(slots=True)
class _DeadLetter:
    partition: int
    entry_id: str
    message: Encoded
    first_ms: int | None
    last_ms: int | None


class Receiver:
    """Streams one subscription to a handler until stopped."""

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
        max_lease_duration: float,
        consumer_expiry: float,
        executor: concurrent.futures.Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        settings = subscription.settings
        self._backend = backend
        self._topic = topic
        self._group = subscription.name
        self._dead_letter_topic = dead_letter_topic
        self._handler = handler
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        )
        self._auto_ack = ack_mode == "auto"
        self._consumer = consumer
        self._clock = clock
        self._wall_clock = wall_clock
        self._ack_deadline = float(settings["ack_deadline"])  # type: ignore[arg-type]
        self._max_attempts = int(settings["max_delivery_attempts"])  # type: ignore[call-overload]
        self._exactly_once = bool(settings.get("enable_exactly_once_delivery"))
        retry = settings.get("retry_policy")
        self._retry = RetryPolicy(**retry) if isinstance(retry, dict) else None
        self._consumer_expiry = consumer_expiry
        self._flow: FlowController[Message] = FlowController(flow_control)
        self._max_messages = flow_control.max_messages
        self._leases: LeaseBook[_Key] = LeaseBook(
            ack_deadline=self._ack_deadline, max_lease_duration=max_lease_duration
        )
        self._held: dict[_Key, Message] = {}
        self._acks: dict[int, list[str]] = collections.defaultdict(list)
        self._forget: dict[int, list[str]] = collections.defaultdict(list)
        self._nacks: dict[int, list[_Nack]] = collections.defaultdict(list)
        self._dead_letters: list[_DeadLetter] = []
        self._owned_acks: dict[int, list[tuple[str, asyncio.Future[None]]]] = (
            collections.defaultdict(list)
        )
        self._settle_wake = asyncio.Event()
        self._settler_woken = False
        self._room = asyncio.Event()
        self._waiting_for_room = False
        self._reclaim_wake = asyncio.Event()
        self._reclaim_due: float | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._ready: collections.deque[Message] = collections.deque()
        self._dispatching = False
        self._tasks: list[asyncio.Task[None]] = []
        self._settler: asyncio.Task[None] | None = None
        self._stopping = False
        self._own_executor = executor is None and not self._is_async
        self._executor = executor or (
            None if self._is_async else concurrent.futures.ThreadPoolExecutor(10, "streamsub")
        )
        self._received = self._reclaimed = self._acked = self._nacked = 0
        self._dead_lettered = self._lost = self._handler_errors = 0

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start reading."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            *(
                loop.create_task(self._supervise("reading", self._read_loop))
                for _ in range(_READERS)
            ),
            loop.create_task(self._supervise("extending leases", self._lease_loop)),
            loop.create_task(self._supervise("reclaiming", self._reclaim_loop)),
        ]
        self._settler = loop.create_task(self._supervise("settling", self._settle_loop))

    async def _supervise(self, what: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while True:
            try:
                await run()
            except Exception:
                log.exception("streamsub: %s for %r failed; restarting it", what, self._group)
                await asyncio.sleep(_ERROR_BACKOFF[1])
            else:
                return

    async def stop(self, timeout: float) -> None:
        """Stop reading, let handlers finish for up to ``timeout`` seconds, give
        back what is left so other subscribers get it at once, flush every ack."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for message in self._flow.drain_hold():
            self._release(message, started=False)
        if self._handlers:
            _, late = await asyncio.wait(set(self._handlers), timeout=timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for message in list(self._held.values()):
            self._release(message, started=True)
        self._wake_settler()
        if self._settler is not None:
            await self._settler
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def statistics(self) -> ReceiverStatistics:
        """A snapshot of the counters."""
        return ReceiverStatistics(
            received=self._received,
            reclaimed=self._reclaimed,
            acked=self._acked,
            nacked=self._nacked,
            dead_lettered=self._dead_lettered,
            lost=self._lost,
            handler_errors=self._handler_errors,
            flow=self._flow.statistics(),
        )

    # --- receiving -------------------------------------------------------------
    async def _read_loop(self) -> None:
        partitions = list(range(self._topic.partitions))
        share = -(-self._max_messages // _READERS)
        errors = _Backoff()
        while True:
            granted = self._flow.reserve(share)
            if granted <= 0:
                self._room.clear()
                self._waiting_for_room = True
                await self._room.wait()
                continue
            count = max(1, granted // len(partitions))
            try:
                entries = await self._backend.read(
                    self._topic, self._group, self._consumer, partitions, count, _READ_BLOCK_MS
                )
            except BaseException as exc:
                self._flow.unreserve(granted)
                if not isinstance(exc, StreamsubError):
                    raise
                await errors.wait("reading", exc)
                continue
            errors.reset()
            self._received += len(entries)
            self._accept(entries, None, reserved=granted)

    def _accept(
        self, entries: list[Entry], reclaimed: list[Reclaimed] | None, *, reserved: int = 0
    ) -> None:
        now = self._clock()
        delivered_ms = int(self._wall_clock() * 1000)
        ready: list[tuple[Message, int]] = []
        keys: list[_Key] = []
        held = self._held
        for index, entry in enumerate(entries):
            try:
                decoded = decode(entry.fields)
            except UndecodableEntry as exc:
                first = reclaimed[index].first_delivery_ms if reclaimed else delivered_ms
                self._undecodable(entry, exc.reason, first, delivered_ms)
                continue
            message = Message(
                data=decoded.data,
                attributes=decoded.attributes,
                ordering_key=decoded.ordering_key,
                partition=entry.partition,
                entry_id=entry.entry_id,
                delivery_attempt=entry.delivery_count,
                subscription=self._group,
                size=decoded.size,
                delivered_ms=delivered_ms,
                receiver=self,
            )
            key = (entry.partition, entry.entry_id)
            held[key] = message
            keys.append(key)
            ready.append((message, decoded.size))
        self._leases.add_many(keys, now)
        self._dispatch(self._flow.received(ready, reserved=reserved))

    def _undecodable(self, entry: Entry, reason: str, first_ms: int, last_ms: int) -> None:
        log.warning(
            "streamsub: entry %s-%s of topic %r is undecodable (%s)",
            entry.partition,
            entry.entry_id,
            self._topic.name,
            reason,
        )
        if self._dead_letter_topic is not None:
            self._queue_dead_letter(
                entry.partition,
                entry.entry_id,
                None,
                entry.fields,
                entry.delivery_count,
                f"{UNDECODABLE}: {reason}",
                first_ms,
                last_ms,
            )
        else:
            delay = self._delay(entry.delivery_count)
            self._nacks[entry.partition].append((entry.entry_id, delay, last_ms, True))
            self._nacked += 1
            self._wake_settler()

    def _dispatch(self, messages: list[Message]) -> None:
        """Start handlers; a handler that settles at once starts the next one from
        this loop, not from inside itself, so a long hold never nests deeply."""
        if not messages:
            return
        self._ready.extend(messages)
        if self._dispatching:
            return
        self._dispatching = True
        try:
            ready, start = self._ready, self._start
            while ready:
                start(ready.popleft())
        finally:
            self._dispatching = False

    def _start(self, message: Message) -> None:
        """Run an async handler eagerly (see ``_eager``): most finish in their first
        step and need no task; a sync handler goes to the thread pool."""
        if not self._is_async:
            self._track(start_eager(self._run_sync(message)))
            return
        coro = self._handler(message)
        context = contextvars.copy_context()
        try:
            waiting_on = context.run(coro.send, None)  # type: ignore[union-attr]
        except StopIteration:
            self._handled(message)
        except (Exception, asyncio.CancelledError) as exc:
            self._failed(message, exc)
        else:
            loop = asyncio.get_running_loop()
            self._track(
                loop.create_task(self._finish(message, resume(coro, waiting_on)), context=context)  # type: ignore[arg-type]
            )

    def _track(self, task: asyncio.Task[None] | None) -> None:
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _finish(self, message: Message, rest: Awaitable[None]) -> None:
        try:
            await rest
        except Exception as exc:
            self._failed(message, exc)
        else:
            self._handled(message)

    async def _run_sync(self, message: Message) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._handler, message)
        except Exception as exc:
            self._failed(message, exc)
        else:
            self._handled(message)

    def _handled(self, message: Message) -> None:
        if self._auto_ack:
            self.settle_ack(message)

    def _failed(self, message: Message, exc: BaseException) -> None:
        self._handler_errors += 1
        log.warning(
            "streamsub: handler failed for message %s of %r (attempt %d): %r",
            message.message_id,
            self._group,
            message.delivery_attempt,
            exc,
        )
        self.settle_nack(message, error=exc)

    # --- settling (called by Message) -----------------------------------------
    def _settle(self, message: Message) -> bool:
        key = (message._partition, message._entry_id)
        if self._held.pop(key, None) is None:
            return False
        self._leases.remove(key)
        admitted = self._flow.finished(message._size)
        if admitted:
            self._dispatch(admitted)
        if self._waiting_for_room:
            self._waiting_for_room = False
            self._room.set()
        if not self._settler_woken:
            self._wake_settler()
        return True

    def _wake_settler(self) -> None:
        if not self._settler_woken:
            self._settler_woken = True
            self._settle_wake.set()

    def settle_ack(self, message: Message) -> None:
        if not self._settle(message):
            return
        self._acked += 1
        if self._exactly_once:
            future = asyncio.get_running_loop().create_future()
            future.add_done_callback(_consume_result)
            self._owned_acks[message._partition].append((message._entry_id, future))
            return
        self._acks[message._partition].append(message._entry_id)
        if message.delivery_attempt > 1:
            self._forget[message._partition].append(message._entry_id)

    async def ack_with_response(self, message: Message) -> None:
        if self._settle(message):
            self._acked += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owned_acks[message._partition].append((message._entry_id, future))
        self._wake_settler()
        await future

    def settle_nack(self, message: Message, *, error: BaseException | None = None) -> None:
        if self._dead_letter_topic is not None and message.delivery_attempt >= self._max_attempts:
            last = f"; last error: {error!r}" if error is not None else "; nacked"
            self.settle_dead_letter(
                message, f"max_delivery_attempts ({self._max_attempts}) reached{last}"
            )
            return
        if self._settle(message):
            delay = self._delay(message.delivery_attempt)
            self._nacks[message._partition].append(
                (message._entry_id, delay, message._delivered_ms, True)
            )
            self._nacked += 1

    def settle_dead_letter(self, message: Message, reason: str) -> None:
        if self._dead_letter_topic is None:
            raise FailedPreconditionError(
                f"subscription {self._group!r} has no dead_letter_topic; nack the message "
                "instead, or create the subscription with dead_letter_topic=..."
            )
        if not self._settle(message):
            return
        decoded = Decoded(message.data, message.ordering_key, message.attributes, message._size)
        self._queue_dead_letter(
            message._partition,
            message._entry_id,
            decoded,
            {},
            message.delivery_attempt,
            reason,
            None,
            message._delivered_ms,
        )

    def _queue_dead_letter(
        self,
        partition: int,
        entry_id: str,
        decoded: Decoded | None,
        raw_fields: Any,
        attempts: int,
        reason: str,
        first_ms: int | None,
        last_ms: int | None,
    ) -> None:
        encoded = dead_letter_message(
            decoded,
            raw_fields=raw_fields,
            topic=self._topic.name,
            subscription=self._group,
            message_id=f"{partition}-{entry_id}",
            delivery_attempts=attempts,
            reason=reason,
        )
        self._dead_letters.append(_DeadLetter(partition, entry_id, encoded, first_ms, last_ms))
        self._dead_lettered += 1
        self._wake_settler()

    def modify_ack_deadline(self, message: Message, seconds: float) -> None:
        if seconds <= 0:
            self.settle_nack(message)
        else:
            key = (message._partition, message._entry_id)
            self._leases.set_deadline(key, self._clock(), seconds)

    def _release(self, message: Message, *, started: bool) -> None:
        """Give a message back at once, at shutdown: not a failure, no backoff. One
        that no handler saw does not count as delivered."""
        key = (message._partition, message._entry_id)
        if self._held.pop(key, None) is None:
            return
        self._leases.remove(key)
        self._flow.finished(message._size, started=started)
        self._nacks[message._partition].append(
            (message._entry_id, 0, message._delivered_ms, started)
        )

    def _delay(self, delivery_attempt: int) -> int:
        """Milliseconds before a message nacked on ``delivery_attempt`` comes back."""
        return int(backoff(self._retry, delivery_attempt) * 1000)

    async def _settle_loop(self) -> None:
        errors = _Backoff()
        while True:
            if not (self._acks or self._nacks or self._dead_letters or self._owned_acks):
                if self._stopping:
                    return
                self._settle_wake.clear()
                self._settler_woken = False
                await self._settle_wake.wait()
                continue
            acks, self._acks = self._acks, collections.defaultdict(list)
            forget, self._forget = self._forget, collections.defaultdict(list)
            nacks, self._nacks = self._nacks, collections.defaultdict(list)
            owned, self._owned_acks = self._owned_acks, collections.defaultdict(list)
            dead, self._dead_letters = self._dead_letters, []
            try:
                if acks:
                    await self._backend.ack(self._topic, self._group, acks, forget)
                    acks = forget = {}
                if owned:
                    await self._send_owned_acks(owned)
                    owned = {}
                if nacks:
                    await self._send_nacks(nacks)
                    nacks = {}
                while dead:
                    await self._send_dead_letter(dead[0])
                    dead.pop(0)
            except StreamsubError as exc:
                self._requeue(acks, forget, nacks, owned, dead)
                await errors.wait("settling", exc)
                continue
            errors.reset()

    def _requeue(
        self,
        acks: dict[int, list[str]],
        forget: dict[int, list[str]],
        nacks: dict[int, list[_Nack]],
        owned: dict[int, list[tuple[str, asyncio.Future[None]]]],
        dead: list[_DeadLetter],
    ) -> None:
        _prepend(self._acks, acks)
        _prepend(self._forget, forget)
        _prepend(self._nacks, nacks)
        _prepend(self._owned_acks, owned)
        self._dead_letters[:0] = dead

    async def _send_owned_acks(
        self, owned: dict[int, list[tuple[str, asyncio.Future[None]]]]
    ) -> None:
        ids = {p: [entry_id for entry_id, _ in items] for p, items in owned.items()}
        acked = await self._backend.ack_owned(self._topic, self._group, self._consumer, ids)
        for partition, items in owned.items():
            done = set(acked.get(partition, ()))
            for entry_id, future in items:
                if future.done():
                    continue
                if entry_id in done:
                    future.set_result(None)
                else:
                    future.set_exception(
                        AckError(
                            f"message {partition}-{entry_id} was not acknowledged: its lease was "
                            "lost and another subscriber may have it now",
                            status=AckStatus.INVALID_ACK_ID,
                        )
                    )

    async def _send_nacks(self, nacks: dict[int, list[_Nack]]) -> None:
        deadline_ms = int(self._ack_deadline * 1000)
        await self._backend.nack(self._topic, self._group, self._consumer, nacks, deadline_ms)
        soonest = min(item[1] for items in nacks.values() for item in items) / 1000
        if not self._stopping:
            due = self._clock() + soonest
            if self._reclaim_due is None or due < self._reclaim_due:
                self._reclaim_due = due
                self._reclaim_wake.set()

    async def _send_dead_letter(self, dead: _DeadLetter) -> None:
        target = self._dead_letter_topic
        assert target is not None  # only queued when there is one
        key = dead.message.ordering_key
        if key is not None:
            target_partition = partition_for_key(key, target.partitions)
        else:
            target_partition = dead.partition % target.partitions
        message_id = await self._backend.dead_letter(
            self._topic,
            self._group,
            dead.partition,
            dead.entry_id,
            target,
            target_partition,
            dead.message.packed,
            dead.first_ms,
            dead.last_ms,
        )
        log.warning(
            "streamsub: message %s-%s of %r went to dead-letter topic %r as %s",
            dead.partition,
            dead.entry_id,
            self._group,
            target.name,
            message_id,
        )

    # --- leases ----------------------------------------------------------------
    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self._leases.extend_interval)
            due = self._leases.due(self._clock())
            for partition, entry_id in due.expired:
                log.warning(
                    "streamsub: message %s-%s of %r passed its lease (max_lease_duration or "
                    "modify_ack_deadline); it is no longer extended and another subscriber "
                    "may receive it",
                    partition,
                    entry_id,
                    self._group,
                )
            if not due.extend:
                continue
            ids: dict[int, list[str]] = collections.defaultdict(list)
            for partition, entry_id in due.extend:
                ids[partition].append(entry_id)
            try:
                owned = await self._backend.extend(self._topic, self._group, self._consumer, ids)
            except StreamsubError as exc:
                log.warning("streamsub: extending leases failed: %s", exc)
                continue
            for partition, entry_ids in ids.items():
                still = set(owned.get(partition, ()))
                for entry_id in entry_ids:
                    if entry_id not in still:
                        self._leases.remove((partition, entry_id))

    # --- reclaiming ------------------------------------------------------------
    @property
    def reclaim_interval(self) -> float:
        """How often idle entries are swept: a crashed consumer's messages come
        back within 1.25 ack deadlines."""
        return self._ack_deadline / 4

    async def _reclaim_loop(self) -> None:
        errors = _Backoff()
        min_idle_ms = int(self._ack_deadline * 1000)
        consumer_sweep_every = min(_CONSUMER_SWEEP_EVERY, self._consumer_expiry / 2)
        next_consumer_sweep = self._clock() + consumer_sweep_every
        self._reclaim_due = self._clock()  # at start: take over what others gave back
        while True:
            wait = min(self.reclaim_interval, max(0.0, next_consumer_sweep - self._clock()))
            if self._reclaim_due is not None:
                wait = min(wait, max(0.0, self._reclaim_due - self._clock()))
            self._reclaim_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reclaim_wake.wait(), wait)
            if self._reclaim_due is not None and self._reclaim_due > self._clock():
                continue
            self._reclaim_due = None
            try:
                await self._sweep(min_idle_ms)
                if self._clock() >= next_consumer_sweep:
                    next_consumer_sweep = self._clock() + consumer_sweep_every
                    await self._delete_idle_consumers()
            except StreamsubError as exc:
                await errors.wait("reclaiming", exc)
                continue
            errors.reset()

    async def _sweep(self, min_idle_ms: int) -> None:
        max_attempts = self._max_attempts if self._dead_letter_topic is not None else 0
        # What our handlers still hold is ours, leased or not: claiming it again
        # would count a delivery that does not happen.
        skip: dict[int, list[str]] = collections.defaultdict(list)
        for partition, entry_id in self._held:
            skip[partition].append(entry_id)
        cursors = dict.fromkeys(range(self._topic.partitions), "-")
        while cursors:
            # Not read_budget(): blocked reads hold reservations for up to a
            # second, and the reclaimer must not starve behind them.
            budget = self._flow.free()
            if budget <= 0:
                return
            count = max(1, min(_RECLAIM_BATCH, budget // len(cursors)))
            found, next_cursors = await self._backend.reclaim(
                self._topic,
                self._group,
                self._consumer,
                cursors,
                min_idle_ms,
                count,
                max_attempts,
                skip,
            )
            deliver: list[Reclaimed] = []
            for item in found:
                entry = item.entry
                if item.state == "lost":
                    self._lost += 1
                    log.error(
                        "streamsub: message %s-%s of %r was trimmed before it was acknowledged "
                        "and is lost",
                        entry.partition,
                        entry.entry_id,
                        self._group,
                    )
                elif (entry.partition, entry.entry_id) in self._held:
                    continue  # settled-and-held race: it came back while we still had it
                elif item.state == "exhausted":
                    self._exhausted(item)
                else:
                    deliver.append(item)
            if deliver:
                self._reclaimed += len(deliver)
                self._accept([item.entry for item in deliver], deliver)
            cursors = {p: c for p, c in next_cursors.items() if c != "0-0"}

    def _exhausted(self, item: Reclaimed) -> None:
        entry = item.entry
        try:
            decoded: Decoded | None = decode(entry.fields)
            reason = f"max_delivery_attempts ({self._max_attempts}) reached"
        except UndecodableEntry as exc:
            decoded, reason = None, f"{UNDECODABLE}: {exc.reason}"
        self._queue_dead_letter(
            entry.partition,
            entry.entry_id,
            decoded,
            entry.fields,
            entry.delivery_count,
            reason,
            item.first_delivery_ms,
            item.last_delivery_ms,
        )

    async def _delete_idle_consumers(self) -> None:
        deleted = await self._backend.delete_idle_consumers(
            self._topic, self._group, self._consumer, int(self._consumer_expiry * 1000)
        )
        if deleted:
            log.info(
                "streamsub: deleted idle consumers of %r that held nothing: %s",
                self._group,
                ", ".join(deleted),
            )


def _prepend(queue: dict[int, list[_T]], items: dict[int, list[_T]]) -> None:
    """Put back what a failed call did not send, ahead of what came since."""
    for partition, entries in items.items():
        queue[partition][:0] = entries


def _consume_result(future: asyncio.Future[None]) -> None:
    """Plain acks in exactly-once mode report a lost lease in the log only."""
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.warning("streamsub: %s", exc)


class _Backoff:
    """Waits between retries of a failing Redis call, and says so in the log."""

    def __init__(self) -> None:
        self._delay = 0.0

    def reset(self) -> None:
        if self._delay:
            log.warning("streamsub: Redis answers again")
        self._delay = 0.0

    async def wait(self, what: str, exc: BaseException) -> None:
        low, high = _ERROR_BACKOFF
        self._delay = min(high, self._delay * 2 or low)
        log.warning("streamsub: %s failed (%s); retrying in %.2f s", what, exc, self._delay)
        await asyncio.sleep(self._delay)
