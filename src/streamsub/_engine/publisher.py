"""The publisher: one flusher task per topic writes batches, one at a time.

A batch is written while the next one fills, so under load batches grow by
themselves and round trips stay few. Up to four batches are in flight, sent
one behind the other on one connection, which Redis runs in order: messages of
one ordering key stay in publish order. A failed write fails every
publish of that batch with the backend's error: the messages may or may not be
stored, and the caller decides whether to publish again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Sequence

from .._backends.base import Backend, TopicRecord
from .._core.batch import Batch, Batcher
from .._core.codec import Encoded
from .._core.partition import StickyPartitioner, partition_for_key
from .._errors import ClosedError
from .._settings import BatchSettings

__all__ = ["TopicPublisher"]

_MAX_IN_FLIGHT = 4
"""Batches written at once: Redis appends one while the next is on its way."""
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
        self._ready: collections.deque[Batch[_Token]] = collections.deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    @property
    def topic(self) -> TopicRecord:
        return self._topic

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

    async def publish(self, messages: Sequence[Encoded]) -> list[str]:
        """Queue ``messages`` (already checked) and return their ids once written."""
        if self._closed:
            raise ClosedError("the publisher is closed; publish before closing the client")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        waiter = _Waiter(len(messages))
        now = self._clock()
        batcher = self._batcher
        for index, message in enumerate(messages):
            if batcher.would_overflow(message.size):
                self._close_batch()
            partition = self._partition(message)
            if batcher.add(partition, message.packed, message.size, (waiter, index), now):
                self._close_batch()
        self._wake.set()
        return await waiter.future

    def _close_batch(self) -> None:
        self._ready.append(self._batcher.take())
        self._sticky.advance()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        while True:
            if self._ready:
                if len(in_flight) >= _MAX_IN_FLIGHT:
                    _, in_flight = await asyncio.wait(
                        in_flight, return_when=asyncio.FIRST_COMPLETED
                    )
                    continue
                # Started in order, written in order: the backend sends each
                # write behind the previous one on the same connection.
                in_flight.add(loop.create_task(self._write(self._ready.popleft())))
                continue
            deadline = self._batcher.deadline()
            if deadline is None:
                if self._closed:
                    await asyncio.gather(*in_flight)
                    return
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
        except Exception as exc:  # every publish of the batch learns of the failure
            for messages in batch.values():
                for _, (waiter, _index) in messages:
                    waiter.fail(exc)
            return
        for partition, messages in batch.items():
            prefix = f"{partition}-"
            for (_, (waiter, index)), entry_id in zip(messages, ids[partition], strict=True):
                waiter.resolve(index, prefix + entry_id)

    async def aclose(self) -> None:
        """Write what is queued, then stop."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task
