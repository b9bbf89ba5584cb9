"""The publisher: one flusher task per topic writes batches, in order.

A batch is written while the next one fills, so under load batches grow by
themselves and round trips stay few. Up to four batches are in flight, sent
one behind the other on one connection, which Redis runs in order: messages of
one ordering key stay in publish order.

A failed write fails every publish of that batch with the backend's error: the
messages may or may not be stored, and the caller decides whether to publish
again. It also fails every publish still waiting behind it (queued, or waiting
for room), so that a key's later messages never overtake an earlier failed one,
and a publish on a dead connection fails within one socket timeout rather than
one per batch queued ahead of it.

The queue is bounded: while more than :data:`MAX_QUEUED_BATCHES` batches' worth
of messages or bytes wait unsent, ``publish`` waits (in call order) for room.

The flusher task is supervised: if it dies on an unexpected error, every
publish waiting on it fails with a ``BackendError`` saying so, and the next
publish starts a new one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from .._backends.base import Backend, TopicRecord
from .._core.batch import Batch, Batcher
from .._core.codec import Encoded
from .._core.partition import StickyPartitioner, partition_for_key
from .._errors import BackendError, ClosedError, StreamsubError
from .._settings import BatchSettings

__all__ = ["MAX_IN_FLIGHT", "MAX_QUEUED_BATCHES", "TopicPublisher"]

log = logging.getLogger("streamsub")

MAX_IN_FLIGHT = 4
"""Batches written at once: Redis appends one while the next is on its way."""
MAX_QUEUED_BATCHES = 10
"""``publish`` waits while more than this many batches' worth of messages
(``BatchSettings.max_messages``) or bytes (``max_bytes``) wait unsent: 10,000
messages or 10 MiB by default. One call may go past it by its own size."""
_KEY_CACHE_SIZE = 65536
"""Partitions of recent ordering keys, so hot keys are hashed once."""


class _Waiter:
    """The ids of one publish call, filled in as its messages are written."""

    __slots__ = ("future", "ids", "missing")

    def __init__(self, count: int) -> None:
        self.future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self.ids: list[str] = [""] * count
        self.missing = count

    def resolve(self, index: int, message_id: str) -> None:
        self.ids[index] = message_id
        self.missing -= 1
        if self.missing == 0 and not self.future.done():
            self.future.set_result(self.ids)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


_Token = tuple[_Waiter, int]


def _fail_batch(batch: Batch[_Token], exc: BaseException) -> None:
    for messages in batch.values():
        for _, (waiter, _index) in messages:
            waiter.fail(exc)


class TopicPublisher:
    """Batches and writes the messages of one topic."""

    def __init__(
        self,
        backend: Backend,
        topic: TopicRecord,
        settings: BatchSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._topic = topic
        self._clock = clock
        self._batcher: Batcher[_Token] = Batcher(settings)
        self._sticky = StickyPartitioner(topic.partitions, start=int(time.time_ns()) >> 10)
        self._key_partitions: dict[str, int] = {}
        self._ready: collections.deque[tuple[Batch[_Token], int, int]] = collections.deque()
        self._open_messages = 0
        self._open_bytes = 0
        self._queued_messages = 0
        self._queued_bytes = 0
        self._max_queued_messages = MAX_QUEUED_BATCHES * settings.max_messages
        self._max_queued_bytes = MAX_QUEUED_BATCHES * settings.max_bytes
        self._admission: collections.deque[asyncio.Future[None]] = collections.deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    @property
    def topic(self) -> TopicRecord:
        return self._topic

    @property
    def queued(self) -> tuple[int, int]:
        """Messages and bytes published and not yet handed to a write."""
        return self._queued_messages, self._queued_bytes

    @property
    def waiting_for_room(self) -> int:
        """Publish calls waiting for the queue to have room."""
        return len(self._admission)

    def _partition(self, message: Encoded) -> int:
        key = message.ordering_key
        if key is None:
            return self._sticky.current
        partition = self._key_partitions.get(key)
        if partition is None:
            if len(self._key_partitions) >= _KEY_CACHE_SIZE:
                self._key_partitions.clear()
            partition = self._key_partitions[key] = partition_for_key(key, self._topic.partitions)
        return partition

    def _full(self) -> bool:
        return (
            self._queued_messages >= self._max_queued_messages
            or self._queued_bytes >= self._max_queued_bytes
        )

    async def _admit(self) -> None:
        """Wait, behind earlier waiters, until the queue has room."""
        if not self._admission and not self._full():
            return
        future = asyncio.get_running_loop().create_future()
        self._admission.append(future)
        try:
            await future
        except BaseException:  # failed, or cancelled: make way for the next one
            with contextlib.suppress(ValueError):
                self._admission.remove(future)
            self._let_in()
            raise
        # Only the first waiter is woken: it leaves the line and queues its
        # messages before the next one runs, which keeps call order.
        self._admission.popleft()

    def _let_in(self) -> None:
        """Wake the first publish waiting for room, if there is room."""
        if self._admission and not self._full():
            head = self._admission[0]
            if not head.done():
                head.set_result(None)

    async def publish(self, messages: Sequence[Encoded]) -> list[str]:
        """Queue ``messages`` (already checked) and return their ids once written."""
        if self._closed:
            raise ClosedError("the publisher is closed; publish before closing the client")
        await self._admit()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        waiter = _Waiter(len(messages))
        now = self._clock()
        batcher = self._batcher
        for index, message in enumerate(messages):
            if batcher.would_overflow(message.size):
                self._close_batch()
            partition = self._partition(message)
            self._open_messages += 1
            self._open_bytes += message.size
            if batcher.add(partition, message.packed, message.size, (waiter, index), now):
                self._close_batch()
        self._queued_messages += len(messages)
        self._queued_bytes += sum(message.size for message in messages)
        self._wake.set()
        self._let_in()  # the next waiter, if this call left room
        return await waiter.future

    def _close_batch(self) -> None:
        self._ready.append((self._batcher.take(), self._open_messages, self._open_bytes))
        self._open_messages = self._open_bytes = 0
        self._sticky.advance()

    def _unqueue(self, messages: int, size: int) -> None:
        self._queued_messages -= messages
        self._queued_bytes -= size
        self._let_in()

    def _fail_waiting(self, exc: BaseException) -> None:
        """Fail every publish queued or waiting for room (not those in flight)."""
        if len(self._batcher):
            self._close_batch()
        ready, self._ready = self._ready, collections.deque()
        for batch, _, _ in ready:
            _fail_batch(batch, exc)
        self._queued_messages = self._queued_bytes = 0
        admission, self._admission = self._admission, collections.deque()
        for future in admission:
            if not future.done():
                future.set_exception(exc)

    def _unexpected(self, exc: BaseException) -> BackendError:
        error = BackendError(
            f"publishing to topic {self._topic.name!r} stopped on an unexpected error "
            f"({exc!r}); the messages may or may not be stored: publish them again, "
            "which starts it anew"
        )
        error.__cause__ = exc
        return error

    async def _run(self) -> None:
        try:
            await self._flush()
        except BaseException as exc:
            error = self._unexpected(exc)
            log.error("streamsub: %s", error)
            self._fail_waiting(error)
            if not isinstance(exc, Exception):
                raise
            # Otherwise handed to every waiting publish: nothing left to report.

    def _write_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is not None:
            self._wake.set()  # the flusher takes it up and stops

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        while True:
            for task in [task for task in in_flight if task.done()]:
                in_flight.discard(task)
                task.result()  # a write that died takes the flusher with it
            if self._ready:
                if len(in_flight) >= MAX_IN_FLIGHT:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                # Started in order, written in order: the backend sends each
                # write behind the previous one on the same connection.
                batch, messages, size = self._ready.popleft()
                self._unqueue(messages, size)
                task = loop.create_task(self._write(batch))
                task.add_done_callback(self._write_done)
                in_flight.add(task)
                continue
            deadline = self._batcher.deadline()
            if deadline is None:
                if self._closed and not self._admission:
                    if not in_flight:
                        return
                    await asyncio.wait(in_flight)
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = deadline - self._clock()
            if delay > 0 and not self._closed:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                if self._ready:
                    continue
                if (self._batcher.deadline() or 0) > self._clock() and not self._closed:
                    continue
            if len(self._batcher):
                self._close_batch()

    async def _write(self, batch: Batch[_Token]) -> None:
        payload = {p: b"".join([packed for packed, _ in messages]) for p, messages in batch.items()}
        try:
            ids = await self._backend.append(self._topic, payload)
            for partition, messages in batch.items():
                prefix = f"{partition}-"
                for (_, (waiter, index)), entry_id in zip(messages, ids[partition], strict=True):
                    waiter.resolve(index, prefix + entry_id)
        except StreamsubError as exc:  # every publish of the batch learns of the failure
            _fail_batch(batch, exc)
            self._fail_waiting(exc)
        except BaseException as exc:
            _fail_batch(batch, self._unexpected(exc))
            raise

    async def aclose(self) -> None:
        """Write what is queued, then stop."""
        self._closed = True
        self._wake.set()
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task])
