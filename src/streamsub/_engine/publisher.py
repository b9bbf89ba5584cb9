"""The publisher: one flusher task per topic writes batches, in order.

Batching is adaptive (the rule is in ``_core/batch.py``): while no write is in
flight the writer is free, and what is queued goes out at once, so a lone
``publish`` costs one round trip and a ``publish_many`` never waits for a
timer. While writes are in flight, messages gather into the next batch until it
is full, a write comes back, or its oldest message has waited
``BatchSettings.max_latency``: a write in flight is the batching window, so
under load batches grow by themselves and round trips stay few. Up to four
writes are in flight, sent one behind the other on one connection, which
Redis runs in order: messages of one ordering key stay in publish order.
A crowd of callers each awaiting a single publish is written in halves
(``SPLIT_AT``): the publisher counts the single publishes outstanding, and
once they reach twice ``SPLIT_AT`` a batch is full at half of them, so Redis
stores one half while the callers of the other publish again.

On Redis Cluster a batch goes as one write per master (``write_groups``), and
each master has its own four writes in flight, as Kafka's producer sends one
request per broker with its own requests in flight: a master that is down or
slow holds back only its own partitions' publishes (while what waits for it
fits in ``PublishFlowControl``). A batch closes by the batching rule of the
least busy master it goes to, and messages without a key leave a master that
has all its writes out (:meth:`TopicPublisher._keyless`). Writes start in
order per partition: a write waits behind an earlier one to one of its
partitions, whichever master that one waits for (``_core/write_queue.py``).

A write that fails fails the publishes of its messages with the backend's
error (per partition: a batch's other partitions may be stored) and pauses
their ordering keys (see ``_core/publish_flow.py``): their messages still
queued fail with :class:`OrderingKeyPausedError`, and so does every later
publish with them until ``resume``. Messages without a key and other keys flow
on. A lost connection (:class:`UnavailableError`) also fails every publish
still queued, pausing their keys too, so that a publish on a dead connection
fails within one socket timeout rather than one per batch queued ahead of it;
its messages may or may not be stored. So does a deleted topic
(:class:`TopicNotFoundError`): nothing queued could be stored in it.

Redis runs the writes in flight in order, but one answered with an error (out
of memory, read-only replica) does not stop those sent behind it, which would
store a key's later message without its earlier one. So each write to a
partition is linked (:class:`~streamsub._backends.base.Link`) to the
publisher's previous write to it while that one is in flight, and Redis runs it
only if that one was stored: a failure on a partition also fails the writes
already in flight behind it (at most ``MAX_IN_FLIGHT - 1``; their keyed
publishes get the same error and their keys pause, while their messages
without a key, having no order to keep, are written once more on their own),
and no new write to the partition starts until those have come back. Publish
order per key holds through any failure. A
write's results may come back before those of the write it is linked after (on
Redis Cluster, when the two went to different nodes: the slot moved, or the
earlier one's node was not known yet): the linked write then waits for that
one's results, so that its publishes get that write's error, not the link's.

Single publishes of data alone (no ordering key, no attributes) wait in the
batch's lane (``_core/batch.py``) for the partition of messages without a key,
and join the batch as one entry, a run (:class:`_Lane`), where their order
needs it and as it closes: a crowd of such callers costs one append a
publish, one ``pack_data`` for each lane a write holds (most often one), and
one pass handing out the ids.

A large ``publish_many`` of messages that are data alone (no ordering key, no
attributes: most of them) is packed a chunk at a time, and each chunk goes to a
write of its own while fewer than ``MAX_IN_FLIGHT`` are in flight, so that
Redis stores the first chunks while the client packs the rest (see
:meth:`TopicPublisher.queue_data`); its messages are all checked first, and
flow control admits the call as a whole, as for any publish.

Every client has one :class:`PublishGate`, shared by its topics' publishers:
``publish`` takes its messages' share of ``PublishFlowControl`` before it
queues them, and gives it back as they are stored or fail.

The flusher task is supervised: if it dies on an unexpected error, every
publish waiting on it fails with a ``BackendError`` saying so, and the next
publish starts a new one, which counts (and a close waits for) the writes
its predecessor left in flight. No publish is left waiting by an unexpected error
elsewhere either: a batch that the backend fails to route to its nodes is
queued as it is and fails as a failed write does (``BackendError``, its keys
paused), and a write whose answer cannot be handed out (ids missing) fails
the publishes it has not answered.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import functools
import itertools
import logging
import operator
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, cast

from .. import metrics
from .._backends.base import Backend, BrokenLinkError, Link, TopicRecord
from .._core.batch import Batch, Batcher
from .._core.codec import Encoded, pack_data
from .._core.crowd import CrowdMeter
from .._core.partition import StickyPartitioner, partition_for_key
from .._core.publish_flow import PausedKeys, PublishBudget
from .._core.write_queue import WriteQueue
from .._errors import (
    BackendError,
    ClosedError,
    FlowControlLimitError,
    OrderingKeyPausedError,
    StreamsubError,
    TopicNotFoundError,
    UnavailableError,
)
from .._settings import BatchSettings, LimitExceededBehavior, PublishFlowControl

__all__ = ["FIRST_CHUNK", "MAX_IN_FLIGHT", "PublishGate", "TopicPublisher"]

log = logging.getLogger("streamsub")

MAX_IN_FLIGHT = 4
"""Batches written at once: Redis appends one while the next is on its way."""
FIRST_CHUNK = 128
"""Messages of a large ``publish_many`` packed before its first write starts
(see :meth:`TopicPublisher.queue_data`): measured in benchmarks/README.md."""
WRITER_FREE_BELOW = 1
"""The writer is free, and a batch goes out at once, while fewer writes than
this are in flight (see ``_core/batch.py``): measured in benchmarks/README.md."""
SPLIT_AT = 8
"""From twice this many single publishes outstanding at once (a crowd of
callers), a batch is full at half of them, and the other half goes out beside
the first (see ``_core/batch.py``): measured in benchmarks/README.md."""
_KEY_CACHE_SIZE = 65536
"""Partitions of recent ordering keys, so hot keys are hashed once."""


def _forget_death(write: asyncio.Task[None]) -> None:
    """Mark a write's death seen: it failed its own publishes already."""
    if not write.cancelled():
        write.exception()


def _lone(token: _Token) -> int:
    """The single publishes (``submit_one``) of ``token``: one for a bare
    future, each of a lane's run, none of a call's waiter."""
    return 0 if type(token.waiter) is _Waiter else token.length


class _Entry:
    """A publish call waiting in the gate's line: its share, and the topic and
    ordering keys that a failed publish may pause under it."""

    __slots__ = ("future", "keys", "messages", "size", "topic")

    def __init__(self, messages: int, size: int, topic: str | None, keys: list[str]) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.messages = messages
        self.size = size
        self.topic = topic
        self.keys = keys


class PublishGate:
    """One client's :class:`PublishFlowControl`: admits publish calls in call order."""

    def __init__(self, settings: PublishFlowControl) -> None:
        self._budget = PublishBudget(settings)
        self._error_over_limit = settings.limit_exceeded_behavior is LimitExceededBehavior.ERROR
        self._line: collections.deque[_Entry] = collections.deque()
        self._pause_watchers: list[Callable[[], None]] = []

    def watch_pauses(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever ordering keys are paused (the blocking client
        wakes its threads waiting for room, to fail those of a paused key)."""
        self._pause_watchers.append(callback)

    @property
    def outstanding(self) -> tuple[int, int]:
        """Messages and bytes published and not yet stored or failed."""
        return self._budget.messages, self._budget.bytes

    @property
    def waiting(self) -> int:
        """Publish calls waiting for room (``BLOCK``)."""
        return len(self._line)

    def try_take(self, messages: int, size: int) -> bool:
        """Count a call as outstanding if it may go at once (False: it must wait,
        with :meth:`acquire`); raise :class:`FlowControlLimitError` with ``ERROR``
        when it goes past a limit."""
        if self._error_over_limit:
            self._refuse_over(messages, size)
            self._budget.take(messages, size)
            return True
        return not self._line and self._budget.try_take(messages, size)

    def _refuse_over(self, messages: int, size: int) -> None:
        over = self._budget.over(messages, size)
        if over is not None:
            raise FlowControlLimitError(
                f"publish refused by PublishFlowControl(limit_exceeded_behavior=ERROR) "
                f"at its {over}; nothing of it was written: publish it again once "
                "earlier publishes complete, or raise the limit"
            )

    async def acquire(
        self,
        messages: int,
        size: int,
        *,
        topic: str | None = None,
        keys: Iterable[str | None] = (),
    ) -> None:
        """Count a call of ``messages`` and ``size`` bytes as outstanding: at once if
        it fits and nobody waits, else as its behaviour says.

        A call that waits may fail with :class:`OrderingKeyPausedError` when one of
        its ordering ``keys`` is paused on ``topic`` meanwhile (see
        :meth:`fail_paused`); it then takes nothing.
        """
        budget = self._budget
        if self._error_over_limit:
            self._refuse_over(messages, size)
        elif self._line or not budget.fits(messages, size):
            await self._wait(messages, size, topic, keys)
            return
        budget.take(messages, size)

    async def _wait(
        self, messages: int, size: int, topic: str | None, keys: Iterable[str | None]
    ) -> None:
        entry = _Entry(messages, size, topic, [key for key in keys if key is not None])
        self._line.append(entry)
        try:
            await entry.future
        except BaseException:  # cancelled or failed: make way for the next one
            with contextlib.suppress(ValueError):
                self._line.remove(entry)
            future = entry.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self._budget.release(messages, size)  # admitted, then cancelled
            self._let_in()
            raise
        # Admitted ones leave the line only as they resume, in order: until then
        # a new call may not pass them (it would overtake their messages).
        self._line.remove(entry)

    def release(self, messages: int, size: int) -> None:
        """Messages stored or failed: give their share back and admit who fits."""
        if messages:
            self._budget.release(messages, size)
            self._let_in()

    def fail_paused(self, topic: str, paused: PausedKeys) -> None:
        """Fail every call waiting for room with an ordering key of ``topic`` that is
        now ``paused``, at once, with :class:`OrderingKeyPausedError`.

        Left waiting, such a call would be admitted after the key's failed
        messages are published again (``resume_publish``, then publish), and
        its later message would be stored first. It took nothing: it leaves
        the line, and the calls behind it may go in.
        """
        for watcher in self._pause_watchers:
            watcher()
        failed: list[_Entry] = []
        for entry in self._line:
            if entry.future.done() or entry.topic != topic:
                continue  # admitted ones check for a pause as they resume
            key = paused.first_paused(entry.keys)
            if key is not None:
                entry.future.set_exception(OrderingKeyPausedError(topic, key))
                failed.append(entry)
        if failed:
            # Out of the line now, so that those behind them are let in at once.
            for entry in failed:
                self._line.remove(entry)
            self._let_in()

    def _let_in(self) -> None:
        budget = self._budget
        for entry in self._line:
            if entry.future.done():
                continue  # admitted, not yet resumed
            if not budget.fits(entry.messages, entry.size):
                return
            budget.take(entry.messages, entry.size)
            entry.future.set_result(None)


class _Waiter:
    """The ids of one publish call, filled in as its messages are written."""

    __slots__ = ("future", "ids", "missing")

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[list[str]] = loop.create_future()
        self.ids: list[str] = [""] * count
        self.missing = count

    def resolve(self, index: int, message_id: str) -> None:
        self.ids[index] = message_id
        self.missing -= 1
        if self.missing == 0 and not self.future.done():
            self.future.set_result(self.ids)

    def resolve_run(self, index: int, message_ids: list[str]) -> None:
        """The ids of the call's messages ``index``, ``index + 1``, ... at once."""
        count = len(message_ids)
        if count == len(self.ids):
            self.ids = message_ids  # the whole call in one run: no copy
        else:
            self.ids[index : index + count] = message_ids
        self.missing -= count
        if self.missing == 0 and not self.future.done():
            self.future.set_result(self.ids)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class _Lane:
    """A batch's lane (``Batcher.add_data``) as it is written: the single
    publishes of data alone that it gathered, in publish order, their data not
    yet packed (:func:`_packed` packs them as one run) and the future of each
    one's id."""

    __slots__ = ("datas", "futures", "sizes")

    def __init__(self, datas: list[bytes], futures: list[asyncio.Future[str]]) -> None:
        self.datas = datas
        self.sizes = list(map(len, datas))
        self.futures = futures

    def fail(self, exc: BaseException) -> None:
        for future in self.futures:
            if not future.done():
                future.set_exception(exc)


def _set_ids(futures: Iterable[asyncio.Future[str]], prefix: str, ids: list[str]) -> None:
    """Give each of ``futures`` (single publishes, in order) its id: ``prefix``
    and its entry id of ``ids``."""
    for future, entry_id in zip(futures, ids, strict=True):
        if not future.done():
            future.set_result(prefix + entry_id)


def _failed(token: _Token) -> bool:
    """Whether the publish call of ``token`` has failed already (a call that
    was cancelled has not: its messages are written all the same)."""
    waiter = token.waiter
    if isinstance(waiter, _Lane):  # single publishes: written again unless all failed
        return all(future.done() and not future.cancelled() for future in waiter.futures)
    future = waiter.future if isinstance(waiter, _Waiter) else waiter
    return future.done() and not future.cancelled()


def _fail_waiter(waiter: _Waiter | _Lane | asyncio.Future[str], exc: BaseException) -> None:
    """Fail the publish call that ``waiter`` stands for, if it is not done."""
    if isinstance(waiter, _Waiter | _Lane):
        waiter.fail(exc)
    elif not waiter.done():  # one message's own future (see submit_one)
        waiter.set_exception(exc)


class _Token(NamedTuple):
    """One queued message, a run of ``length`` messages of one call without
    ordering keys (packed one after the other, see ``_core/batch.py``), or a
    batch's lane of ``length`` single publishes of data alone: whose they are,
    and what the bookkeeping needs of them (``size``: of them all).
    ``waiter``: the call's; for a call of one message (:meth:`TopicPublisher.
    submit_one`, the shape of most calls) the future of its id; for a lane, the
    lane (its entry's bytes are empty: :func:`_packed` packs the lane's)."""

    waiter: _Waiter | _Lane | asyncio.Future[str]
    position: int
    key: str | None
    size: int
    length: int = 1


_bytes_of = operator.itemgetter(0)
_token_of = operator.itemgetter(1)
_length_of = operator.attrgetter("length")
_waiter_of = operator.attrgetter("waiter")


def _packed(entries: list[tuple[bytes, _Token]]) -> bytes:
    """One partition's part of a write: its entries' bytes in order, a lane's
    data packed as one run (``codec.pack_data``)."""
    if len(entries) == 1:  # a lone publish's write, or a crowd's lane
        entry, token = entries[0]
        lane = token.waiter
        return pack_data(lane.datas, lane.sizes) if type(lane) is _Lane else entry
    if _Lane not in map(type, map(_waiter_of, map(_token_of, entries))):
        return b"".join(map(_bytes_of, entries))  # no Python step a message
    parts = []
    for entry, token in entries:
        lane = token.waiter
        parts.append(pack_data(lane.datas, lane.sizes) if type(lane) is _Lane else entry)
    return b"".join(parts)


_new_token = cast(
    "Callable[[tuple[asyncio.Future[str] | _Lane, int, str | None, int, int]], _Token]",
    functools.partial(tuple.__new__, _Token),
)
"""``_Token`` of a tuple of all its fields, without the Python frame of a named
tuple's ``__new__`` (each single publish, or each batch's lane, makes one)."""


def _lane_entry(datas: list[bytes], futures: list[asyncio.Future[str]]) -> tuple[bytes, _Token]:
    """A batch's lane as its entry (see ``_core/batch.py``): no bytes of its own,
    the lane's packed as the write is built (:func:`_packed`)."""
    lane = _Lane(datas, futures)
    return b"", _new_token((lane, 0, None, sum(lane.sizes), len(futures)))


_Refused = list[tuple[int, list[tuple[bytes, _Token]]]]
"""Partitions whose writes were refused behind a failed write, with their
messages without an ordering key."""


class _Ready(NamedTuple):
    """A closed batch waiting for its write: on Redis Cluster, its messages for
    one ``node`` (see :meth:`TopicPublisher._close_batch`)."""

    batch: Batch[_Token]
    messages: int
    size: int
    node: str | None = None
    lone: int = 0
    """Of ``messages``, the single publishes (``submit_one``)."""
    unrouted: BackendError | None = None
    """Why the batch could not be routed to its nodes: its write fails with it."""


class TopicPublisher:
    """Batches and writes the messages of one topic."""

    def __init__(
        self,
        backend: Backend,
        topic: TopicRecord,
        settings: BatchSettings,
        *,
        gate: PublishGate | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_gone: Callable[[TopicPublisher], None] | None = None,
    ) -> None:
        """``on_gone(self)``: called once, when a write finds the topic deleted,
        before the callers of its publishes resume (the client then looks the
        topic up anew)."""
        self._backend = backend
        self._on_gone = on_gone
        self._gone_error: str | None = None
        self._topic = topic
        self._clock = clock
        self._gate = gate or PublishGate(PublishFlowControl())
        self._batcher: Batcher[_Token, asyncio.Future[str]] = Batcher(
            settings, free_below=WRITER_FREE_BELOW, split_at=SPLIT_AT, lane=_lane_entry
        )
        self._max_batch = settings.max_messages
        self._max_batch_bytes = settings.max_bytes
        self._sticky = StickyPartitioner(topic.partitions, start=int(time.time_ns()) >> 10)
        self._key_partitions: dict[str, int] = {}
        self._paused = PausedKeys()
        self._ready: WriteQueue[_Ready] = WriteQueue()
        self._in_flight: dict[asyncio.Task[None], str | None] = {}
        """The writes started and not yet done, each with its node."""
        self._busy: dict[str | None, int] = {}
        """Per node, its writes in flight: at most ``MAX_IN_FLIGHT`` each."""
        self._node_of: dict[int, str | None] = {}
        """Per partition, its node when a batch last went to it (empty on one
        server)."""
        self._nodes: set[str | None] = set()
        """The nodes of ``_node_of``."""
        self._crowd = CrowdMeter(rounds=MAX_IN_FLIGHT)
        """Single publishes (``submit_one``) outstanding: the crowd the batcher
        splits (``_core/crowd.py``, ``_core/batch.py``)."""
        self._one_server = False
        """The backend said it has one server (``write_groups`` None)."""
        self._entering = 0
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The flusher's loop, the loop of every publish while it runs."""
        # Links between writes (see the module docstring).
        self._writer = secrets.token_hex(8)
        self._writes = 0
        self._last_write: dict[int, int] = {}
        self._unsettled: collections.Counter[int] = collections.Counter()
        self._failures: dict[int, StreamsubError] = {}
        self._settled: dict[int, asyncio.Future[None]] = {}
        """Per write number in flight: done once its results were handed out."""

    @property
    def topic(self) -> TopicRecord:
        return self._topic

    @property
    def queued(self) -> tuple[int, int]:
        """Messages and bytes published and not yet handed to a write."""
        parts = self._ready.items()
        return (
            len(self._batcher) + sum([part.messages for part in parts]),
            self._batcher.size + sum([part.size for part in parts]),
        )

    def paused(self, ordering_key: str) -> bool:
        """Whether a failed publish paused ``ordering_key`` on this topic."""
        return ordering_key in self._paused

    def resume(self, ordering_key: str) -> bool:
        """Let publishes with ``ordering_key`` go again; return whether it was paused."""
        return self._paused.resume(ordering_key)

    def _keyless(self) -> int:
        """The partition for messages without an ordering key: the sticky one,
        moved on when its master has all the writes in flight it may (down, or
        slow) to one whose master has room, as Kafka's adaptive partitioner
        does (KIP-794). On one server, the sticky one."""
        sticky = self._sticky
        node_of = self._node_of
        if node_of:
            busy = self._busy
            if busy.get(node_of.get(sticky.current), 0) >= MAX_IN_FLIGHT and (
                len(busy) < len(self._nodes) or min(busy.values()) < MAX_IN_FLIGHT
            ):  # full, and another master has room
                for _ in range(self._topic.partitions):
                    sticky.advance()
                    if busy.get(node_of.get(sticky.current), 0) < MAX_IN_FLIGHT:
                        break
        return sticky.current

    def _partition(self, key: str | None) -> int:
        """The partition of a message with ordering key ``key``."""
        if key is None:
            return self._keyless()
        partition = self._key_partitions.get(key)
        if partition is None:
            if len(self._key_partitions) >= _KEY_CACHE_SIZE:
                self._key_partitions.clear()
            partition = self._key_partitions[key] = partition_for_key(key, self._topic.partitions)
        return partition

    def _check_paused(self, messages: Sequence[Encoded]) -> None:
        key = self._paused.first_paused(message.ordering_key for message in messages)
        if key is not None:
            raise OrderingKeyPausedError(self._topic.name, key)

    def submit(self, messages: Sequence[Encoded]) -> asyncio.Future[list[str]] | None:
        """Queue ``messages`` (already checked) if flow control lets them in at
        once, and return the future of their ids; None when the call must wait
        for room (then :meth:`publish` it). Raises as :meth:`publish` does."""
        if self._closed:
            raise self._closed_error()
        if self._paused.keys:
            self._check_paused(messages)
        size = messages[0].size if len(messages) == 1 else sum([m.size for m in messages])
        if not self._gate.try_take(len(messages), size):
            return None
        return self._enqueue(messages, size)

    def submit_one(self, message: Encoded | bytes) -> asyncio.Future[str] | None:
        """:meth:`submit` of one message: the future of its id (no list of ids,
        no waiter to fill: a single publish is most publishes). ``message``:
        encoded, or the data of a message that is data alone (checked: within
        the size limit), queued as it is in the batch's lane (``_core/batch.py``)
        and written with the lane's others as one run."""
        if self._closed:
            raise self._closed_error()
        if type(message) is bytes:
            size, key = len(message), None
        else:
            packed, size, key = cast("Encoded", message)
            if key is not None and key in self._paused:
                raise OrderingKeyPausedError(self._topic.name, key)
        if not self._gate.try_take(1, size):
            return None
        loop, task = self._loop, self._task
        if loop is None or task is None or task.done():
            loop = self._flusher_loop()
        future: asyncio.Future[str] = loop.create_future()
        batcher = self._batcher
        if size > batcher.room:  # would_overflow(), without its call
            self._close_batch()
        crowd = self._crowd
        crowd.published()
        batcher.concurrency = crowd.concurrency
        if type(message) is bytes:  # to the batch's lane
            partition = self._keyless() if self._node_of else self._sticky.current
            full = batcher.add_data(partition, message, future, self._clock())
        else:
            partition = self._partition(key)
            token = _new_token((future, 0, key, size, 1))
            full = batcher.add(partition, packed, size, token, self._clock(), lone=True)
        if full:
            self._close_batch()
        self._wake.set()
        return future

    async def publish(self, messages: Sequence[Encoded]) -> list[str]:
        """Queue ``messages`` (already checked) and return their ids once written.

        Raises :class:`OrderingKeyPausedError` if one of their keys is paused and
        :class:`FlowControlLimitError` if the gate refuses them: in both cases
        nothing of the call is written.
        """
        future = self.submit(messages)
        if future is None:
            future = await self._submit_when_admitted(messages)
        return await future

    async def _submit_when_admitted(self, messages: Sequence[Encoded]) -> asyncio.Future[list[str]]:
        """Wait in the gate's line for room, then queue ``messages``."""
        size = sum([m.size for m in messages])
        self._entering += 1
        try:
            await self._gate.acquire(
                len(messages),
                size,
                topic=self._topic.name,
                keys=(message.ordering_key for message in messages),
            )
        finally:
            self._entering -= 1
            self._wake.set()  # a closing flusher waits for calls on their way in
        try:
            self._check_paused(messages)  # paused while this call waited for room
        except OrderingKeyPausedError:
            self._gate.release(len(messages), size)
            raise
        return self._enqueue(messages, size)

    async def queue_data(
        self, datas: Sequence[bytes], sizes: list[int], size: int
    ) -> asyncio.Future[list[str]]:
        """Queue messages that are data alone (checked: ``bytes`` within the size
        limit; ``sizes`` theirs, ``size`` their sum) and return the future of
        their ids, as :meth:`publish` does, flow control admitting or refusing
        the call as a whole.

        They are packed a chunk at a time (:data:`FIRST_CHUNK` messages, then
        twice as many each time, up to a batch's messages and bytes), and a
        chunk goes to its own write while fewer than :data:`MAX_IN_FLIGHT` are
        in flight: Redis stores the first chunks while the rest is packed.
        Once admitted, every message is queued, even if the call is cancelled
        meanwhile (as :meth:`publish`'s are), unless a failed write already
        failed the call (the rest then gives its room back).
        """
        if self._closed:
            raise self._closed_error()
        count = len(datas)
        self._entering += 1  # a closing flusher waits for the rest of the call
        try:
            if not self._gate.try_take(count, size):
                await self._gate.acquire(count, size, topic=self._topic.name)
            waiter = _Waiter(count, self._flusher_loop())
            start, chunk = 0, FIRST_CHUNK
            # A chunk holds at most a batch's bytes (and one message at least).
            ends = list(itertools.accumulate(sizes)) if count > chunk else None
            try:
                while start < count and not waiter.future.done():
                    end = min(start + chunk, count)
                    if ends is not None:
                        room = (ends[start - 1] if start else 0) + self._max_batch_bytes
                        end = max(start + 1, bisect.bisect_right(ends, room, start, end))
                    self._queue_chunk(datas, sizes, size, start, end, waiter)
                    start, chunk = end, min(chunk * 2, self._max_batch)
                    if start < count:
                        writes = self._open_busy() + self._ready.count
                        if writes < MAX_IN_FLIGHT and len(self._batcher):
                            self._close_batch()
                        self._wake.set()
                        # The flusher starts the write, the write sends it.
                        await asyncio.sleep(0)
                        await asyncio.sleep(0)
            finally:
                if start < count:  # cancelled, or failed
                    if waiter.future.done():  # a write failed the call: the rest stays out
                        self._gate.release(count - start, sum(sizes[start:]))
                    else:
                        self._queue_chunk(datas, sizes, size, start, count, waiter)
        finally:
            self._entering -= 1
            self._wake.set()
        return waiter.future

    def _queue_chunk(
        self,
        datas: Sequence[bytes],
        sizes: list[int],
        size: int,
        start: int,
        end: int,
        waiter: _Waiter,
    ) -> None:
        """Add messages ``start`` to ``end`` of a :meth:`queue_data` call."""
        whole = start == 0 and end == len(datas)
        part = sizes if whole else sizes[start:end]
        part_size = size if whole else sum(part)
        self._enqueue_runs(
            part,
            part_size,
            lambda first, last: pack_data(
                datas[start + first : start + last], sizes[start + first : start + last]
            ),
            waiter,
            start,
            self._clock(),
        )
        self._wake.set()

    def _flusher_loop(self) -> asyncio.AbstractEventLoop:
        """The flusher's loop; the flusher started if it is not running."""
        loop = self._loop
        if loop is None or self._task is None or self._task.done():
            loop = self._loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run())
        return loop

    def _enqueue(self, messages: Sequence[Encoded], size: int) -> asyncio.Future[list[str]]:
        """Add an admitted call's messages to the batch; the future of their ids."""
        loop = self._flusher_loop()
        count = len(messages)
        waiter = _Waiter(count, loop)
        batcher = self._batcher
        now = self._clock()
        if count == 1 or any(message.ordering_key is not None for message in messages):
            for index, message in enumerate(messages):
                if batcher.would_overflow(message.size):
                    self._close_batch()
                key = message.ordering_key
                token = _Token(waiter, index, key, message.size)
                if batcher.add(self._partition(key), message.packed, message.size, token, now):
                    self._close_batch()
        else:
            self._enqueue_runs(
                [message.size for message in messages],
                size,
                lambda start, end: b"".join([m.packed for m in messages[start:end]]),
                waiter,
                0,
                now,
            )
        self._wake.set()
        return waiter.future

    def _enqueue_runs(
        self,
        sizes: Sequence[int],
        size: int,
        pack: Callable[[int, int], bytes],
        waiter: _Waiter,
        position: int,
        now: float,
    ) -> None:
        """Add messages without ordering keys (``sizes``, ``size`` bytes in all) to
        the sticky partition in runs, as many at a time as the batch takes (see
        ``_core/batch.py``). ``pack(start, end)``: those messages packed; the
        first is the call's message ``position``."""
        batcher = self._batcher
        start, rest, count = 0, size, len(sizes)
        while start < count:
            taken = batcher.fitting(sizes, start, rest)
            if not taken:
                self._close_batch()
                continue
            end = start + taken
            run_size = rest if end == count else sum(sizes[start:end])
            token = _Token(waiter, position + start, None, run_size, taken)
            if batcher.add(self._keyless(), pack(start, end), run_size, token, now, taken):
                self._close_batch()
            start, rest = end, rest - run_size

    def _close_batch(self) -> None:
        batcher = self._batcher
        messages, size, lone = len(batcher), batcher.size, batcher.lone
        ready = _Ready(batcher.take(), messages, size, lone=lone)
        self._sticky.advance()
        try:
            parts = self._per_node(ready)
        except Exception as exc:  # the backend could not say where its partitions go
            # Queued as it is, and its write fails as a failed write does
            # (_write): in the order of the writes, after the caller queued
            # the rest of its call, so a paused key's later messages fail
            # too. The next batch is routed anew.
            error = BackendError(
                f"publishing to topic {self._topic.name!r}: routing a batch failed on an "
                f"unexpected error ({exc!r}); the batch was not written (a call's "
                "messages in other batches may be stored): publish them again"
            )
            error.__cause__ = exc
            log.error("streamsub: %s", error)
            parts = [ready._replace(unrouted=error)]
        for part in parts:
            self._ready.add(part.node, part.batch, part)

    def _fail(
        self, messages: Iterable[tuple[bytes, _Token]], exc: BaseException
    ) -> list[str | None]:
        """Fail the publishes of ``messages`` with ``exc``; return their keys."""
        keys: list[str | None] = []
        for _, token in messages:
            _fail_waiter(token.waiter, exc)
            keys.append(token.key)
        return keys

    def _fail_batch(self, ready: _Ready, exc: StreamsubError) -> None:
        """Fail every publish of ``ready`` with ``exc`` and pause its keys; the
        writes linked behind it fail with ``exc`` too."""
        keys: list[str | None] = []
        for partition, messages in ready.batch.items():
            self._failures.setdefault(partition, exc)
            keys += self._fail(messages, exc)
        self._pause(keys)
        self._gate.release(ready.messages, ready.size)

    def _pause(self, keys: list[str | None]) -> None:
        """Pause ``keys``, and fail the calls with one of them waiting for room."""
        if self._paused.pause(keys):
            self._gate.fail_paused(self._topic.name, self._paused)

    def _drop_queued(self, exc: BaseException | None) -> None:
        """Fail the queued messages of paused keys with OrderingKeyPausedError and,
        given ``exc``, every other queued message with it (pausing their keys)."""
        if len(self._batcher):
            self._close_batch()
        dropped = dropped_size = dropped_lone = 0
        failed_keys: list[str | None] = []

        def keep(ready: _Ready) -> tuple[str | None, Iterable[int], _Ready] | None:
            nonlocal dropped, dropped_size, dropped_lone
            batch: Batch[_Token] = {}
            count = size = lone = 0
            for partition, messages in ready.batch.items():
                kept = []
                for entry in messages:
                    token = entry[1]
                    if token.key is not None and token.key in self._paused:
                        _fail_waiter(
                            token.waiter, OrderingKeyPausedError(self._topic.name, token.key)
                        )
                    elif exc is not None:
                        _fail_waiter(token.waiter, exc)
                        failed_keys.append(token.key)
                    else:
                        kept.append(entry)
                        count += token.length
                        size += token.size
                        lone += _lone(token)
                        continue
                    dropped_lone += _lone(token)
                    dropped += token.length
                    dropped_size += token.size
                if kept:
                    batch[partition] = kept
            if not batch:
                return None
            return ready.node, batch, _Ready(batch, count, size, ready.node, lone, ready.unrouted)

        self._ready.rebuild(keep)
        self._pause(failed_keys)
        self._crowd.dropped(dropped_lone)
        self._gate.release(dropped, dropped_size)

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
            self._drop_queued(error)
            if not isinstance(exc, Exception):
                raise
            # Otherwise handed to every waiting publish: nothing left to report.

    def _write_done(self, partitions: list[int], number: int, task: asyncio.Task[None]) -> None:
        # A callback, not a ``finally`` in _write: it runs even for a write
        # cancelled before it started, whose partitions would stay linked.
        self._crowd.ended(number)
        settled = self._settled.pop(number, None)
        if settled is not None and not settled.done():
            settled.set_result(None)
        for partition in partitions:
            self._unsettled[partition] -= 1
            if not self._unsettled[partition]:
                del self._unsettled[partition]
        # The writer may be free now (see _core/batch.py); a write that died
        # is taken up by the flusher, which stops.
        self._wake.set()

    def _links(self, ready: _Ready) -> dict[int, Link]:
        """Number the write of ``ready`` and link each of its partitions to the
        previous write to it, if that one is still in flight."""
        self._writes += 1
        number = self._writes
        self._settled[number] = asyncio.get_running_loop().create_future()
        links = {}
        for partition in ready.batch:
            after = self._last_write.get(partition) if self._unsettled[partition] else None
            links[partition] = Link(self._writer, number, after)
            self._last_write[partition] = number
            self._unsettled[partition] += 1
        return links

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        # A flusher that died left writes in flight: this one counts them (at
        # most MAX_IN_FLIGHT a node, ever) and, closing, waits for them. Those
        # that died since failed their own publishes: they do not take this
        # flusher with them (one that dies later does, as its own writes do).
        in_flight = self._in_flight
        for task in [task for task in in_flight if task.done()]:
            del in_flight[task]
            _forget_death(task)
        busy: dict[str | None, int] = dict(collections.Counter(in_flight.values()))
        self._busy = busy
        while True:
            for task in [task for task in in_flight if task.done()]:
                node = in_flight.pop(task)
                left = busy[node] - 1
                if left:
                    busy[node] = left
                else:
                    del busy[node]
                task.result()  # a write that died takes the flusher with it
            if self._failures:
                # A failed partition takes writes again once every write linked
                # behind its failure is back (and unlinked: done callbacks ran).
                for partition in [p for p in self._failures if not self._unsettled[p]]:
                    del self._failures[partition]
            if self._ready.count:
                # Those that may start (``_core/write_queue.py``): taken out of
                # the queue before any starts, as a write that finishes at once
                # (an eager task) may rebuild it (_drop_queued).
                for part in self._ready.take(busy, MAX_IN_FLIGHT, self._failures):
                    self._start(part, loop)
            writes = self._open_busy() if self._node_of else busy.get(None, 0)
            if self._ready.count and writes >= MAX_IN_FLIGHT:
                # The open batch's nodes are writing all they may: it grows
                # until a write comes back (_write_done wakes us).
                self._wake.clear()
                await self._wake.wait()
                continue
            due = self._batcher.due(writes)
            if due is None:
                if self._closed and not self._entering and not self._ready.count and not in_flight:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = due - self._clock()
            if delay > 0 and not self._closed:
                # Writes are in flight: wait for more messages, a write to come
                # back (_write_done wakes us) or the latency ceiling.
                self._wake.clear()
                timer = loop.call_later(delay, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
                continue
            self._close_batch()

    def _open_busy(self) -> int:
        """The writes in flight on the least busy node the open batch goes to
        (on one server, all of them): that node's writer is free, or full, for
        the batching rule (``_core/batch.py``); the others' do not hold it."""
        busy = self._busy
        if not busy:
            return 0
        node_of = self._node_of
        if not node_of:  # one server
            return busy.get(None, 0)
        return min([busy.get(node_of.get(p), 0) for p in self._batcher.partitions], default=0)

    def _start(self, ready: _Ready, loop: asyncio.AbstractEventLoop) -> None:
        """Start the write of ``ready``: started in order, written in order (the
        backend sends each write behind the previous one on its node's
        connection)."""
        links = self._links(ready)
        number = next(iter(links.values())).number
        self._crowd.started(number, ready.lone)  # before an eager task can answer it
        task = loop.create_task(self._write(ready, links, number))
        task.add_done_callback(functools.partial(self._write_done, list(links), number))
        self._in_flight[task] = ready.node
        self._busy[ready.node] = self._busy.get(ready.node, 0) + 1

    def _per_node(self, ready: _Ready) -> list[_Ready]:
        """``ready`` as one write per node that holds its partitions (Kafka's
        producer sends one request per broker), so that each write's publishes
        return when their node answers, and each node has its own writes in
        flight: a node that is down or slow holds back only its own partitions'
        publishes. On one server, the batch as it is."""
        batch = ready.batch
        if self._one_server:
            return [ready]
        groups = self._backend.write_groups(self._topic, batch)
        if groups is None:
            self._one_server = True  # a backend's servers do not change kind
            return [ready]
        placed = [partition for group in groups.values() for partition in group]
        if len(placed) != len(batch) or batch.keys() != set(placed) or not all(groups.values()):
            # Written as placed, a partition left out would be lost unanswered.
            raise RuntimeError(
                f"write_groups placed partitions as {groups} for a batch of "
                f"{sorted(batch)}: each must be placed once, no node empty"
            )
        for node, group in groups.items():
            for partition in group:
                self._node_of[partition] = node
        self._nodes = set(self._node_of.values())
        if len(groups) == 1:
            return [ready._replace(node=next(iter(groups)))]
        parts = []
        messages, size, lone = ready.messages, ready.size, ready.lone
        *firsts, (last_node, last) = groups.items()
        for node, group in firsts:
            part = {p: batch[p] for p in group}
            tokens = [token for entries in part.values() for _, token in entries]
            count, part_size = sum([t.length for t in tokens]), sum([t.size for t in tokens])
            part_lone = sum([_lone(t) for t in tokens]) if lone else 0
            parts.append(_Ready(part, count, part_size, node, part_lone))
            messages -= count
            size -= part_size
            lone -= part_lone
        parts.append(_Ready({p: batch[p] for p in last}, messages, size, last_node, lone))
        return parts

    async def _write(self, ready: _Ready, links: dict[int, Link], number: int) -> None:
        batch = ready.batch
        try:
            try:
                if ready.unrouted is not None:
                    raise ready.unrouted
                # Packed in here: an unexpected error packing fails the batch's
                # publishes, as one writing it does, rather than leave them waiting.
                payload = {p: _packed(messages) for p, messages in batch.items()}
                results = await self._backend.append(self._topic, payload, links)
            finally:
                # A round of writes ends: how many callers publish at once now.
                self._crowd.answered(number)
                self._batcher.concurrency = self._crowd.concurrency
        except StreamsubError as exc:  # outcome unknown: every publish of the batch fails
            if isinstance(exc, TopicNotFoundError):
                self._gone(exc)
            self._fail_batch(ready, exc)
            # A lost connection or a deleted topic fails what is queued too.
            self._drop_queued(
                exc if isinstance(exc, UnavailableError | TopicNotFoundError) else None
            )
            return
        except BaseException as exc:
            self._fail_batch(ready, self._unexpected(exc))
            raise
        try:
            failed_keys, gone, refused = await self._hand_out(batch, links, results)
        except BaseException as exc:  # the rest fail rather than wait for ever
            self._fail_batch(ready, self._unexpected(exc))
            raise
        # What the gate still holds of the batch: all of it until the messages
        # written again are known, then those alone.
        held, held_size = ready.messages, ready.size
        try:
            # Handed out: the writes linked behind this one need not wait for
            # what follows (their failures are known from _failures).
            settled = self._settled.get(number)
            if settled is not None and not settled.done():
                settled.set_result(None)
            if gone is not None:
                self._gone(gone)
            if failed_keys:
                # Paused before any await: a caller told of its failure that
                # resumes the key at once is not paused again by this write.
                self._pause(failed_keys)
                # A deleted topic: nothing queued can be stored in it (and, were
                # it made anew, not by this publisher's record of it).
                self._drop_queued(gone)
            again: dict[int, list[tuple[bytes, _Token]]] = {}
            for partition, entries in refused:
                # A call of many that failed meanwhile is not written again in part.
                if kept := [entry for entry in entries if not _failed(entry[1])]:
                    again[partition] = kept
            tokens = [token for entries in again.values() for _, token in entries]
            held, held_size = sum([t.length for t in tokens]), sum([t.size for t in tokens])
            self._gate.release(ready.messages - held, ready.size - held_size)
            if again:
                await self._write_again(again)
        except BaseException as exc:  # what is not answered fails rather than wait for ever
            for _, entries in refused:
                self._fail(entries, self._unexpected(exc))
            raise
        finally:
            self._gate.release(held, held_size)

    async def _hand_out(
        self,
        batch: Batch[_Token],
        links: dict[int, Link],
        results: dict[int, list[str] | StreamsubError],
    ) -> tuple[list[str | None], TopicNotFoundError | None, _Refused]:
        """Give each publish of a written batch its id or its partition's
        error; return the keys of those that failed, the error of a deleted
        topic if the write found one, and the messages without a key of the
        partitions whose writes were refused behind a failed one (nothing of
        them stored), to write again."""
        failed_keys: list[str | None] = []
        gone: TopicNotFoundError | None = None
        stored = 0
        refused: _Refused = []
        for partition, messages in batch.items():
            result = results[partition]
            if isinstance(result, BrokenLinkError):  # behind a failed write: its error
                after = links[partition].after
                earlier = self._settled.get(after) if after is not None else None
                if partition not in self._failures and earlier is not None:
                    await asyncio.shield(earlier)  # its results are still on their way
                if partition not in self._failures:
                    # The earlier write came back stored (a failed one is in
                    # _failures), yet Redis does not hold it now: no write to
                    # the partition links behind it any more.
                    self._failures[partition] = self._lost(partition, result)
                keyed = [entry for entry in messages if entry[1].key is not None]
                if len(keyed) < len(messages):  # no order to keep: written again
                    refused.append((partition, [e for e in messages if e[1].key is None]))
                failed_keys += self._fail(keyed, self._failures[partition])
            elif isinstance(result, StreamsubError):
                if isinstance(result, TopicNotFoundError):
                    gone = result
                self._failures.setdefault(partition, result)
                failed_keys += self._fail(messages, result)
            else:
                stored += self._resolve(partition, messages, result)
        if stored:
            metrics.on_published(self._topic.name, stored)
        return failed_keys, gone, refused

    def _lost(self, partition: int, exc: BrokenLinkError) -> BackendError:
        error = BackendError(
            f"a write to partition {partition} of topic {self._topic.name!r} was refused: "
            "the write before it is not stored on Redis now (it came back stored, so Redis "
            "lost it: a failover to a replica that had not received it, or its link key "
            "evicted or expired); nothing of this write was stored: publish its messages "
            "again (after resume_publish for their ordering keys)"
        )
        error.__cause__ = exc
        return error

    async def _write_again(self, again: dict[int, list[tuple[bytes, _Token]]]) -> None:
        """Write ``again`` (messages without a key, refused behind a failed write)
        once more, unlinked, as one call, and give their publishes ids or the
        write's error."""
        if self._gone_error is not None:  # the topic was deleted meanwhile
            for messages in again.values():
                self._fail(messages, TopicNotFoundError(self._gone_error))
            return
        payload = {p: _packed(messages) for p, messages in again.items()}
        # An unexpected error fails them in _write, as one in handing them out.
        try:
            results = await self._backend.append(self._topic, payload)
        except StreamsubError as exc:
            results = dict.fromkeys(again, exc)
            if isinstance(exc, UnavailableError):
                self._drop_queued(exc)  # as a write that raises it (see _write)
        stored = 0
        for partition, messages in again.items():
            result = results[partition]
            if isinstance(result, StreamsubError):
                self._fail(messages, result)
                if isinstance(result, TopicNotFoundError):
                    self._gone(result)
                    self._drop_queued(result)
            else:
                stored += self._resolve(partition, messages, result)
        if stored:
            metrics.on_published(self._topic.name, stored)

    def _resolve(self, partition: int, messages: list[tuple[bytes, _Token]], ids: list[str]) -> int:
        """Give the publishes of ``messages``, written to ``partition``, their
        ``ids``; return how many were stored."""
        prefix = f"{partition}-"
        if len(ids) != sum(map(_length_of, map(_token_of, messages))):
            raise AssertionError(f"{len(ids)} ids for a write to partition {partition}")
        if len(messages) > 1:
            waiters = list(map(_waiter_of, map(_token_of, messages)))
            kinds = set(map(type, waiters))
            if _Waiter not in kinds and _Lane not in kinds:  # single publishes alone
                _set_ids(cast("list[asyncio.Future[str]]", waiters), prefix, ids)
                return len(ids)
        at = 0
        for _, token in messages:
            waiter = token.waiter
            if isinstance(waiter, _Lane):  # single publishes of data alone: a crowd's, most often
                _set_ids(waiter.futures, prefix, ids[at : at + token.length])
                at += token.length
            elif not isinstance(waiter, _Waiter):  # a call of one message: its id
                if not waiter.done():
                    waiter.set_result(prefix + ids[at])
                at += 1
            elif token.length == 1:
                waiter.resolve(token.position, prefix + ids[at])
                at += 1
            else:
                run = [prefix + entry_id for entry_id in ids[at : at + token.length]]
                waiter.resolve_run(token.position, run)
                at += token.length
        return at

    def _gone(self, exc: TopicNotFoundError) -> None:
        """The topic was deleted: say so once; later publishes here raise it."""
        if self._gone_error is None:
            self._gone_error = str(exc)
            if self._on_gone is not None:
                self._on_gone(self)

    def _closed_error(self) -> StreamsubError:
        if self._gone_error is not None:  # a caller that took this publisher before
            return TopicNotFoundError(self._gone_error)
        return ClosedError("the publisher is closed; publish before closing the client")

    async def aclose(self) -> None:
        """Write what is queued, then stop."""
        self._closed = True
        self._wake.set()
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task])
        writes = [task for task in self._in_flight if not task.done()]
        if writes:  # a flusher that died left them, and none started since
            await asyncio.wait(writes)
            for task in writes:
                _forget_death(task)
