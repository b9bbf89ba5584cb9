"""The receiver: reads a subscription, runs handlers, settles and leases messages.

Four tasks share one flow controller and one lease book:

- the *reader* asks XREADGROUP for no more than the free flow-control slots,
  with a finite block, so it never holds more than it may run;
- the *settler* sends acks (many ids per partition per call) and nacks as they
  come, one round trip at a time, so they batch by themselves under load;
- the *leaser* resets the idle time of held messages three times per ack
  deadline, so no other subscriber's reclaimer takes a message still in hand;
- the *reclaimer* claims entries idle for the ack deadline (a crashed
  consumer's, or nacked ones whose backoff has passed) through the same flow
  control as new ones.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from .._backends.base import Backend, Entry, SubscriptionRecord, TopicRecord
from .._core.codec import UndecodableEntry, decode
from .._core.flow import FlowController, FlowStatistics
from .._core.lease import LeaseBook
from .._core.retry import backoff
from .._errors import StreamsubError
from .._message import Message
from .._settings import FlowControl, RetryPolicy
from ._eager import start_eager

__all__ = ["Handler", "Receiver", "ReceiverStatistics"]

log = logging.getLogger("streamsub")

Handler = Callable[[Message], Awaitable[None]] | Callable[[Message], None]
AckMode = Literal["auto", "manual"]
_Key = tuple[int, str]

_READ_BLOCK_MS = 1000
"""Finite, so a stop or a lost connection is noticed within a second."""
_ERROR_BACKOFF = (0.05, 2.0)
"""Retry a failed Redis call after 50 ms, doubling up to 2 s."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReceiverStatistics:
    """A snapshot of one subscriber's counters."""

    received: int
    reclaimed: int
    acked: int
    nacked: int
    lost: int
    """Entries that were pending but trimmed before anyone acked them."""
    handler_errors: int
    flow: FlowStatistics


class Receiver:
    """Streams one subscription to a handler until stopped."""

    def __init__(
        self,
        *,
        backend: Backend,
        topic: TopicRecord,
        subscription: SubscriptionRecord,
        handler: Handler,
        flow_control: FlowControl,
        ack_mode: AckMode,
        consumer: str,
        max_lease_duration: float,
        executor: concurrent.futures.Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = subscription.settings
        self._backend = backend
        self._topic = topic
        self._group = subscription.name
        self._handler = handler
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        )
        self._auto_ack = ack_mode == "auto"
        self._consumer = consumer
        self._clock = clock
        self._ack_deadline = float(settings["ack_deadline"])  # type: ignore[arg-type]
        retry = settings.get("retry_policy")
        self._retry = RetryPolicy(**retry) if isinstance(retry, dict) else None
        self._flow: FlowController[Message] = FlowController(flow_control)
        self._leases: LeaseBook[_Key] = LeaseBook(
            ack_deadline=self._ack_deadline, max_lease_duration=max_lease_duration
        )
        self._held: dict[_Key, Message] = {}
        self._acks: dict[int, list[str]] = collections.defaultdict(list)
        self._nacks: dict[int, list[tuple[str, float]]] = collections.defaultdict(list)
        self._settle_wake = asyncio.Event()
        self._room = asyncio.Event()
        self._reclaim_wake = asyncio.Event()
        self._reclaim_due: float | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._settler: asyncio.Task[None] | None = None
        self._stopping = False
        self._own_executor = executor is None and not self._is_async
        self._executor = executor or (
            None if self._is_async else concurrent.futures.ThreadPoolExecutor(10, "streamsub")
        )
        self._reader_offset = 0
        self._received = self._reclaimed = self._acked = self._nacked = 0
        self._lost = self._handler_errors = 0

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start reading."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._read_loop(), name="streamsub-reader"),
            loop.create_task(self._lease_loop(), name="streamsub-leaser"),
            loop.create_task(self._reclaim_loop(), name="streamsub-reclaimer"),
        ]
        self._settler = loop.create_task(self._settle_loop(), name="streamsub-settler")

    async def stop(self, timeout: float) -> None:
        """Stop reading, let handlers finish for up to ``timeout`` seconds, release
        what is left so other subscribers get it, and flush every ack."""
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
        self._settle_wake.set()
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
            lost=self._lost,
            handler_errors=self._handler_errors,
            flow=self._flow.statistics(),
        )

    # --- receiving -------------------------------------------------------------
    async def _read_loop(self) -> None:
        partitions = list(range(self._topic.partitions))
        errors = _Backoff()
        while True:
            budget = self._flow.read_budget()
            if budget <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            count = max(1, budget // len(partitions))
            try:
                entries = await self._backend.read(
                    self._topic, self._group, self._consumer, partitions, count, _READ_BLOCK_MS
                )
            except StreamsubError as exc:
                await errors.wait("reading", exc)
                continue
            errors.reset()
            if entries:
                self._received += len(entries)
                self._accept(entries)

    def _accept(self, entries: list[Entry]) -> None:
        now = self._clock()
        ready: list[tuple[Message, int]] = []
        for entry in entries:
            try:
                decoded = decode(entry.fields)
            except UndecodableEntry as exc:
                log.warning(
                    "streamsub: entry %s-%s of topic %r is undecodable (%s); it is nacked",
                    entry.partition,
                    entry.entry_id,
                    self._topic.name,
                    exc.reason,
                )
                delay = self._delay(entry.delivery_count)
                self._nacks[entry.partition].append((entry.entry_id, delay))
                self._nacked += 1
                self._settle_wake.set()
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
                receiver=self,
            )
            key = (entry.partition, entry.entry_id)
            self._held[key] = message
            self._leases.add(key, now)
            ready.append((message, decoded.size))
        self._dispatch(self._flow.received(ready))

    def _dispatch(self, messages: list[Message]) -> None:
        if not messages:
            return
        for message in messages:
            task = start_eager(self._run(message))
            if task is not None:
                self._handlers.add(task)
                task.add_done_callback(self._handlers.discard)

    async def _run(self, message: Message) -> None:
        try:
            if self._is_async:
                await self._handler(message)  # type: ignore[misc]
            else:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, self._handler, message)
        except Exception as exc:
            self._handler_errors += 1
            log.warning(
                "streamsub: handler failed for message %s of %r: %r; it is nacked",
                message.message_id,
                self._group,
                exc,
            )
            self.settle_nack(message)
            return
        if self._auto_ack:
            self.settle_ack(message)

    # --- settling (called by Message) -----------------------------------------
    def _settle(self, message: Message) -> bool:
        key = (message._partition, message._entry_id)
        if self._held.pop(key, None) is None:
            return False
        self._leases.remove(key)
        self._dispatch(self._flow.finished(message._size))
        self._room.set()
        self._settle_wake.set()
        return True

    def settle_ack(self, message: Message) -> None:
        if self._settle(message):
            self._acks[message._partition].append(message._entry_id)
            self._acked += 1

    def settle_nack(self, message: Message) -> None:
        if self._settle(message):
            delay = self._delay(message.delivery_attempt)
            self._nacks[message._partition].append((message._entry_id, delay))
            self._nacked += 1

    def modify_ack_deadline(self, message: Message, seconds: float) -> None:
        if seconds <= 0:
            self.settle_nack(message)
        else:
            self._leases.set_deadline(
                (message._partition, message._entry_id), self._clock(), seconds
            )

    def _release(self, message: Message, *, started: bool) -> None:
        """Give a message back at once, at shutdown: not a failure, no backoff."""
        key = (message._partition, message._entry_id)
        if self._held.pop(key, None) is None:
            return
        self._leases.remove(key)
        self._flow.finished(message._size, started=started)
        self._nacks[message._partition].append((message._entry_id, 0.0))

    def _delay(self, delivery_attempt: int) -> float:
        # Without a delay set, the longest delay is the ack deadline: the
        # reclaimer takes an entry once it has been idle that long.
        return min(backoff(self._retry, delivery_attempt), self._ack_deadline)

    async def _settle_loop(self) -> None:
        errors = _Backoff()
        while True:
            if not self._acks and not self._nacks:
                if self._stopping:
                    return
                self._settle_wake.clear()
                await self._settle_wake.wait()
                continue
            acks, self._acks = self._acks, collections.defaultdict(list)
            nacks, self._nacks = self._nacks, collections.defaultdict(list)
            try:
                if acks:
                    await self._backend.ack(self._topic, self._group, acks)
                if nacks:
                    await self._send_nacks(nacks)
            except StreamsubError as exc:
                for partition, ids in acks.items():
                    self._acks[partition][:0] = ids
                for partition, items in nacks.items():
                    self._nacks[partition][:0] = items
                await errors.wait("settling", exc)
                continue
            errors.reset()

    async def _send_nacks(self, nacks: dict[int, list[tuple[str, float]]]) -> None:
        by_idle: dict[int, dict[int, list[str]]] = collections.defaultdict(dict)
        deadline_ms = int(self._ack_deadline * 1000)
        soonest = None
        for partition, items in nacks.items():
            for entry_id, delay in items:
                idle = deadline_ms - int(delay * 1000)
                by_idle[idle].setdefault(partition, []).append(entry_id)
                soonest = delay if soonest is None else min(soonest, delay)
        for idle, ids in by_idle.items():
            await self._backend.set_idle(self._topic, self._group, self._consumer, ids, idle)
        if soonest is not None and not self._stopping:
            due = self._clock() + soonest
            if self._reclaim_due is None or due < self._reclaim_due:
                self._reclaim_due = due
                self._reclaim_wake.set()

    # --- leases ----------------------------------------------------------------
    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self._leases.extend_interval)
            due = self._leases.due(self._clock())
            for partition, entry_id in due.expired:
                log.warning(
                    "streamsub: message %s-%s of %r passed max_lease_duration; it is no longer "
                    "extended and another subscriber may receive it",
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
                owned = await self._backend.set_idle(
                    self._topic, self._group, self._consumer, ids, 0
                )
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
        while True:
            now = self._clock()
            wait = self.reclaim_interval
            if self._reclaim_due is not None:
                wait = min(wait, max(0.0, self._reclaim_due - now))
            self._reclaim_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reclaim_wake.wait(), wait)
            if self._reclaim_due is not None and self._reclaim_due > self._clock():
                continue
            self._reclaim_due = None
            try:
                await self._sweep(min_idle_ms)
            except StreamsubError as exc:
                await errors.wait("reclaiming", exc)
                continue
            errors.reset()

    async def _sweep(self, min_idle_ms: int) -> None:
        cursors = dict.fromkeys(range(self._topic.partitions), "0-0")
        while cursors:
            budget = self._flow.read_budget()
            if budget <= 0:
                return
            count = max(1, min(100, budget // len(cursors)))
            entries, next_cursors, lost = await self._backend.reclaim(
                self._topic, self._group, self._consumer, cursors, min_idle_ms, count
            )
            for partition, ids in lost.items():
                self._lost += len(ids)
                log.error(
                    "streamsub: %d pending messages of %r in partition %d were trimmed before "
                    "they were acknowledged and are lost: %s",
                    len(ids),
                    self._group,
                    partition,
                    ", ".join(ids[:10]),
                )
            fresh = [e for e in entries if (e.partition, e.entry_id) not in self._held]
            if fresh:
                self._reclaimed += len(fresh)
                self._accept(fresh)
            cursors = {p: c for p, c in next_cursors.items() if c != "0-0"}


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
