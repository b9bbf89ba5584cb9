"""The settler: acks, nacks and dead letters, batched per partition.

Settling is a plain, thread-safe call (``message.ack()`` from an async handler,
a plain ``def`` in the thread pool, or any thread): the message leaves the
inventory at once, which frees its flow-control slot, and the request waits in
a queue. One task sends the queues, one round trip per kind at a time, so they
batch by themselves under load. A failed send is put back and retried after a
pause; at shutdown the queues get a bounded time to flush.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import metrics
from .._backends.base import Backend, NackItem, TopicRecord
from .._core.codec import Decoded, Encoded
from .._core.deadletter import dead_letter_message
from .._core.partition import partition_for_key
from .._core.retry import backoff
from .._errors import (
    AckError,
    AckStatus,
    FailedPreconditionError,
    NotFoundError,
    StreamsubError,
)
from .._message import Message
from .._settings import RetryPolicy
from ._inventory import Counters, Inventory
from ._retrying import Backoff, raise_if_cancelled

__all__ = ["Settler"]

log = logging.getLogger("streamsub")

_T = TypeVar("_T")
_OwnedAck = tuple[str, int, "asyncio.Future[None]", int]
"""(entry id, delivery attempt, who waits for the answer, when delivered in ms)."""


_Flight = tuple[
    dict[int, list[str]],
    dict[int, list[NackItem]],
    dict[int, list[_OwnedAck]],
    dict[int, list[_OwnedAck]],
    list["_DeadLetter"],
]
_NOTHING: _Flight = ({}, {}, {}, {}, [])


@dataclasses.dataclass(slots=True)
class _DeadLetter:
    partition: int
    entry_id: str
    message: Encoded
    first_ms: int | None
    last_ms: int | None
    aside: int | None
    """Bytes held aside in flow control until it is sent (entries with no handler)."""


class Settler:
    """Queues and sends what handlers decide; the :class:`Settling` of messages."""

    def __init__(
        self,
        *,
        backend: Backend,
        topic: TopicRecord,
        group: str,
        consumer: str,
        inventory: Inventory,
        counters: Counters,
        ack_deadline: float,
        max_attempts: int,
        retry: RetryPolicy | None,
        exactly_once: bool,
        dead_letter_topic: TopicRecord | None,
        on_nacked: Callable[[float], None],
        checked_acks: bool = False,
    ) -> None:
        self._backend = backend
        self._topic = topic
        self._group = group
        self._consumer = consumer
        self._inventory = inventory
        self._counters = counters
        self._ack_deadline_ms = int(ack_deadline * 1000)
        self._max_attempts = max_attempts
        self._retry = retry
        self._exactly_once = exactly_once
        # Exactly-once, and ordered subscriptions (a deposed owner's late ack must
        # not settle the delivery a new owner took over): acks checked in Redis.
        self._checked_acks = exactly_once or checked_acks
        self._dead_letter_topic = dead_letter_topic
        self._on_nacked = on_nacked
        self._acks: dict[int, list[str]] = collections.defaultdict(list)
        self._forget: dict[int, list[str]] = collections.defaultdict(list)
        self._nacks: dict[int, list[NackItem]] = collections.defaultdict(list)
        self._owned: dict[int, list[_OwnedAck]] = collections.defaultdict(list)
        self._owned_nacks: dict[int, list[_OwnedAck]] = collections.defaultdict(list)
        self._dead_letters: list[_DeadLetter] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._flight: _Flight = _NOTHING
        """What the send under way took from the queues (lost if it is cancelled)."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    # --- the Settling protocol (any thread) ------------------------------------
    def ack(self, message: Message) -> None:
        self._call(self._ack, message)

    def nack(self, message: Message) -> None:
        self._call(self.nack_failed, message, None)

    def dead_letter(self, message: Message, reason: str) -> None:
        if self._dead_letter_topic is None:
            raise FailedPreconditionError(
                f"subscription {self._group!r} has no dead_letter_topic; nack the message "
                "instead, or create the subscription with dead_letter_topic=..."
            )
        self._call(self._dead_letter_message, message, reason)

    def modify_ack_deadline(self, message: Message, seconds: float) -> None:
        self._call(self._modify_ack_deadline, message, seconds)

    async def ack_with_response(self, message: Message) -> None:
        await self._with_response(message, self._owned)

    async def nack_with_response(self, message: Message) -> None:
        await self._with_response(message, self._owned_nacks)

    def _call(self, function: Callable[..., None], *args: Any) -> None:
        if threading.get_ident() == self._thread:
            function(*args)
            return
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop is closed: the subscriber is long gone
            log.warning("streamsub: a message was settled after its subscriber closed")

    # --- on the loop -------------------------------------------------------------
    def _ack(self, message: Message) -> None:
        if not self._inventory.settle(message):
            return
        self._counters.acked += 1
        partition = message._partition
        if self._checked_acks:
            self._queue_owned_ack(message)
        else:
            self._acks[partition].append(message._entry_id)
            if message.delivery_attempt > 1:
                self._forget[partition].append(message._entry_id)
        self._wake.set()

    def ack_returned(self, messages: list[Message]) -> None:
        """Ack the messages of handlers that returned (auto-ack; on the loop): as
        :meth:`ack` each, settled in one pass."""
        settled = self._inventory.settle_many(messages)
        if not settled:
            return
        self._counters.acked += len(settled)
        if self._checked_acks:
            for message in settled:
                self._queue_owned_ack(message)
        else:
            acks, forget = self._acks, self._forget
            for message in settled:
                acks[message._partition].append(message._entry_id)
                if message.delivery_attempt > 1:
                    forget[message._partition].append(message._entry_id)
        self._wake.set()

    def _queue_owned_ack(self, message: Message) -> None:
        future = self._loop.create_future()
        future.add_done_callback(_log_lost_lease)
        self._owned[message._partition].append(
            (message._entry_id, message.delivery_attempt, future, message._delivered_ms)
        )

    def nack_failed(self, message: Message, error: BaseException | None) -> None:
        """Nack ``message`` with the retry policy's backoff; on its last attempt
        with a dead-letter topic, dead-letter it instead."""
        if self._dead_letter_topic is not None and message.delivery_attempt >= self._max_attempts:
            last = f"; last error: {error!r}" if error is not None else "; nacked"
            self._dead_letter_message(
                message, f"max_delivery_attempts ({self._max_attempts}) reached{last}"
            )
            return
        self._give_back(message, self._delay_ms(message.delivery_attempt))

    def _modify_ack_deadline(self, message: Message, seconds: float) -> None:
        if seconds <= 0:
            self._give_back(message, 0)  # Pub/Sub's nack: redeliver now, no backoff
            return
        key = (message._partition, message._entry_id)
        if self._inventory.held.get(key) is message:
            self._inventory.leases.set_deadline(key, self._inventory.now(), seconds)

    def _give_back(self, message: Message, delay_ms: int) -> None:
        if not self._inventory.settle(message, done=False):
            return
        self._nacks[message._partition].append(
            NackItem(
                message._entry_id, delay_ms, message._delivered_ms, message.delivery_attempt, True
            )
        )
        self._counters.nacked += 1
        self._wake.set()

    def release(self, message: Message) -> None:
        """Give ``message`` back at once (shutdown): not a failure, no backoff; one
        no handler saw does not count as delivered."""
        if not self._inventory.settle(message, done=False):
            return
        self._nacks[message._partition].append(
            NackItem(
                message._entry_id,
                0,
                message._delivered_ms,
                message.delivery_attempt,
                message._started,
            )
        )
        self._wake.set()

    def withdraw(self, message: Message) -> list[Message]:
        """Give back ``message``, let start but not started (its partition is no
        longer ours): no handler saw it, so its delivery is not counted. Return
        the messages that may start in its place."""
        admitted = self._inventory.withdraw(message)
        if admitted is None:
            return []
        self._nacks[message._partition].append(
            NackItem(message._entry_id, 0, message._delivered_ms, message.delivery_attempt, False)
        )
        self._wake.set()
        return admitted

    def release_entries(self, partition: int, entries: Sequence[tuple[str, int]]) -> None:
        """Give back entries read but never held, as (entry id, delivery count): their
        delivery is not counted."""
        items = self._nacks[partition]
        for entry_id, count in entries:
            items.append(NackItem(entry_id, 0, 0, count, False))
        self._wake.set()

    def nack_entry(self, partition: int, entry_id: str, attempt: int, delivered_ms: int) -> None:
        """Nack an entry that is no message (undecodable, no dead-letter topic)."""
        self._nacks[partition].append(
            NackItem(entry_id, self._delay_ms(attempt), delivered_ms, attempt, True)
        )
        self._counters.nacked += 1
        self._wake.set()

    def _dead_letter_message(self, message: Message, reason: str) -> None:
        if not self._inventory.settle(message):
            return
        decoded = Decoded(message.data, message.ordering_key, message.attributes, message._size)
        self.dead_letter_entry(
            message._partition,
            message._entry_id,
            decoded,
            (),
            message.delivery_attempt,
            reason,
            None,
            message._delivered_ms,
            aside=None,
        )

    def dead_letter_entry(
        self,
        partition: int,
        entry_id: str,
        decoded: Decoded | None,
        raw_fields: Sequence[bytes],
        attempts: int,
        reason: str,
        first_ms: int | None,
        last_ms: int | None,
        *,
        aside: int | None,
    ) -> None:
        """Queue a dead letter; ``aside`` is its flow-control size when it was held
        without a handler (released once it is sent)."""
        encoded = dead_letter_message(
            decoded,
            raw_fields=raw_fields,
            topic=self._topic.name,
            subscription=self._group,
            message_id=f"{partition}-{entry_id}",
            delivery_attempts=attempts,
            reason=reason,
        )
        self._dead_letters.append(
            _DeadLetter(partition, entry_id, encoded, first_ms, last_ms, aside)
        )
        self._wake.set()

    def _delay_ms(self, delivery_attempt: int) -> int:
        return int(backoff(self._retry, delivery_attempt) * 1000)

    async def _with_response(self, message: Message, queue: dict[int, list[_OwnedAck]]) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                "ack_with_response() and nack_with_response() are coroutines of the "
                "subscriber's event loop; from a plain def handler call ack() or nack()"
            )
        if not self._inventory.settle(message, done=queue is self._owned):
            raise AckError(
                f"message {message.message_id} (attempt {message.delivery_attempt}) was "
                "settled before or its lease was lost",
                status=AckStatus.INVALID_ACK_ID,
            )
        if queue is self._owned:
            self._counters.acked += 1
        else:
            self._counters.nacked += 1
        future: asyncio.Future[None] = self._loop.create_future()
        queue[message._partition].append(
            (message._entry_id, message.delivery_attempt, future, message._delivered_ms)
        )
        self._wake.set()
        await future

    # --- sending -----------------------------------------------------------------
    def _pending(self) -> bool:
        return bool(
            self._acks or self._nacks or self._owned or self._owned_nacks or self._dead_letters
        )

    def unsent(self) -> int:
        """Requests queued and not yet sent."""
        return (
            sum(map(len, self._acks.values()))
            + sum(map(len, self._nacks.values()))
            + sum(map(len, self._owned.values()))
            + sum(map(len, self._owned_nacks.values()))
            + len(self._dead_letters)
        )

    def giving_back(self, partition: int) -> bool:
        """Whether nacks or give-backs of ``partition`` are queued or being sent."""
        return bool(self._nacks.get(partition) or self._flight[1].get(partition))

    async def run(self) -> None:
        """Send queued requests until closed and empty."""
        errors = Backoff()
        while True:
            raise_if_cancelled()
            if not self._pending():
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            acks, self._acks = self._acks, collections.defaultdict(list)
            forget, self._forget = self._forget, collections.defaultdict(list)
            nacks, self._nacks = self._nacks, collections.defaultdict(list)
            owned, self._owned = self._owned, collections.defaultdict(list)
            owned_nacks, self._owned_nacks = self._owned_nacks, collections.defaultdict(list)
            dead, self._dead_letters = self._dead_letters, []
            self._flight = (acks, nacks, owned, owned_nacks, dead)
            try:
                if acks:
                    await self._backend.ack(self._topic, self._group, acks, forget)
                    self._acked(acks)
                    for partition, entry_ids in acks.items():
                        self._inventory.sent(partition, entry_ids)
                    acks.clear()
                    forget.clear()
                if owned:
                    await self._send_owned_acks(owned)
                    owned.clear()
                if owned_nacks:
                    await self._send_owned_nacks(owned_nacks)
                    owned_nacks.clear()
                if nacks:
                    await self._send_nacks(nacks)
                    nacks.clear()
                while dead:
                    await self._send_dead_letter(dead[0])
                    dead.pop(0)
            except NotFoundError:
                raise  # a topic is gone: the receiver stops with it
            except StreamsubError as exc:
                _prepend(self._acks, acks)
                _prepend(self._forget, forget)
                _prepend(self._nacks, nacks)
                _prepend(self._owned, owned)
                _prepend(self._owned_nacks, owned_nacks)
                self._dead_letters[:0] = dead
                self._flight = _NOTHING
                await errors.wait("settling", exc)
                continue
            self._flight = _NOTHING
            errors.reset()

    def _acked(self, acks: dict[int, list[str]]) -> None:
        """Report acks the server took, with their end-to-end latency (publish time
        is the entry id's milliseconds)."""
        now_ms = time.time() * 1000
        seconds: list[float] = []
        ms, latency = "", 0.0
        for entry_ids in acks.values():
            for entry_id in entry_ids:
                published = entry_id.partition("-")[0]
                if published != ms:  # a batch's ids share few milliseconds
                    ms, latency = published, (now_ms - int(published)) / 1000
                seconds.append(latency)
        metrics.observe_end_to_end_latencies(self._group, seconds)
        metrics.on_acked(self._group, len(seconds))

    def close(self) -> None:
        """Finish once the queues are empty."""
        self._closing = True
        self._wake.set()

    def abandon(self) -> int:
        """Drop what could not be sent (shutdown with the server gone); return how
        many requests were dropped. Their messages are delivered again later."""
        acks, nacks, owned, owned_nacks, dead = self._flight
        dropped = self.unsent() + len(dead)
        dropped += sum(len(ids) for ids in acks.values())
        dropped += sum(len(items) for items in nacks.values())
        dropped += sum(len(items) for q in (owned, owned_nacks) for items in q.values())
        self._flight = _NOTHING
        for queue in (self._owned, self._owned_nacks, owned, owned_nacks):
            for items in queue.values():
                for _, _, future, _ in items:
                    if not future.done():
                        future.set_exception(
                            AckError(
                                "the subscriber stopped before the server confirmed",
                                status=AckStatus.OTHER,
                            )
                        )
        self._inventory.forget_settling()
        self._acks.clear()
        self._forget.clear()
        self._nacks.clear()
        self._owned.clear()
        self._owned_nacks.clear()
        self._dead_letters.clear()
        return dropped

    async def _send_owned_acks(self, owned: dict[int, list[_OwnedAck]]) -> None:
        ids = {
            p: [(entry_id, attempt) for entry_id, attempt, _, _ in items]
            for p, items in owned.items()
        }
        acked = await self._backend.ack_owned(self._topic, self._group, self._consumer, ids)
        _answer(owned, acked, "acknowledged")
        for partition, pairs in ids.items():
            self._inventory.sent(partition, (entry_id for entry_id, _ in pairs))
        self._acked(acked)

    async def _send_owned_nacks(self, owned: dict[int, list[_OwnedAck]]) -> None:
        items = {
            p: [
                NackItem(entry_id, self._delay_ms(attempt), delivered_ms, attempt, True)
                for entry_id, attempt, _, delivered_ms in entries
            ]
            for p, entries in owned.items()
        }
        given = await self._backend.nack(
            self._topic, self._group, self._consumer, items, self._ack_deadline_ms
        )
        _answer(owned, given, "given back")
        self._nacked(items)

    async def _send_nacks(self, nacks: dict[int, list[NackItem]]) -> None:
        await self._backend.nack(
            self._topic, self._group, self._consumer, nacks, self._ack_deadline_ms
        )
        self._nacked(nacks)

    def _nacked(self, nacks: dict[int, list[NackItem]]) -> None:
        for partition, items in nacks.items():
            self._inventory.sent(partition, (item.entry_id for item in items))
        metrics.on_nacked(
            self._group, sum(1 for items in nacks.values() for i in items if i.handled)
        )
        if not self._closing:
            self._on_nacked(min(item.delay_ms for items in nacks.values() for item in items) / 1000)

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
            self._consumer,
            dead.partition,
            dead.entry_id,
            target,
            target_partition,
            dead.message.packed,
            dead.first_ms,
            dead.last_ms,
        )
        if dead.aside is not None:
            self._inventory.finish_aside(dead.aside)
        self._inventory.sent(dead.partition, (dead.entry_id,))
        if message_id is None:
            log.info(
                "streamsub: message %s-%s of %r was not dead-lettered: it is no longer this "
                "subscriber's (moved or acknowledged already, or its lease was lost)",
                dead.partition,
                dead.entry_id,
                self._group,
            )
            return
        self._counters.dead_lettered += 1
        metrics.on_dead_lettered(self._group)
        log.warning(
            "streamsub: message %s-%s of %r went to dead-letter topic %r as %s",
            dead.partition,
            dead.entry_id,
            self._group,
            target.name,
            message_id,
        )


def _answer(waiting: dict[int, list[_OwnedAck]], done: dict[int, list[str]], what: str) -> None:
    for partition, items in waiting.items():
        ok = set(done.get(partition, ()))
        for entry_id, attempt, future, _ in items:
            if future.done():
                continue
            if entry_id in ok:
                future.set_result(None)
            else:
                future.set_exception(
                    AckError(
                        f"message {partition}-{entry_id} (attempt {attempt}) was not {what}: "
                        "its lease was lost and another subscriber may have it now",
                        status=AckStatus.INVALID_ACK_ID,
                    )
                )


def _prepend(queue: dict[int, list[_T]], items: dict[int, list[_T]]) -> None:
    """Put back what a failed call did not send, ahead of what came since."""
    for partition, entries in items.items():
        queue[partition][:0] = entries


def _log_lost_lease(future: asyncio.Future[None]) -> None:
    """Plain acks checked in Redis (exactly-once, ordered) report a lost lease in
    the log only."""
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.warning("streamsub: %s", exc)
