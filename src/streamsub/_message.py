"""Messages: the outgoing form a publisher takes, and the received one a handler gets."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Generator, Mapping
from typing import Any, Protocol

__all__ = ["Message", "OutgoingMessage", "Settling"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, init=False)
class OutgoingMessage:
    """A message to publish with ``publish_many``."""

    data: bytes
    ordering_key: str | None = None
    attributes: Mapping[str, str] | None = None

    def __init__(
        self,
        *,
        data: bytes,
        ordering_key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> None:
        # Through the slots' own setters: the __init__ a frozen dataclass
        # writes calls object.__setattr__ per field, 0.72 µs a message built,
        # a quarter of what publish_many's own Python then cost a message
        # (benchmarks/README.md, "A lone publish, counted").
        _set_data(self, data)
        _set_ordering_key(self, ordering_key)
        _set_attributes(self, attributes)


_set_data = OutgoingMessage.__dict__["data"].__set__
_set_ordering_key = OutgoingMessage.__dict__["ordering_key"].__set__
_set_attributes = OutgoingMessage.__dict__["attributes"].__set__


class Settling(Protocol):
    """What a message needs from the subscriber that received it: the small
    settling protocol its methods call, and nothing more of the receiver.

    Each method may be called from any thread; the subscriber hands the call
    to its event loop.
    """

    def ack(self, message: Message) -> None: ...

    def nack(self, message: Message) -> None: ...

    def dead_letter(self, message: Message, reason: str) -> None: ...

    def modify_ack_deadline(self, message: Message, seconds: float) -> None: ...

    async def ack_with_response(self, message: Message) -> None: ...

    async def nack_with_response(self, message: Message) -> None: ...


class Settled:
    """What the settling methods return: nothing to wait for.

    ``message.ack()`` takes effect when called, as in Pub/Sub's clients. Awaiting
    the result, as streamsub 0.1 required (``await message.ack()``), still works
    and is deprecated.
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, Any, None]:
        return
        yield  # a generator that finishes at once

    def __repr__(self) -> str:
        return "Settled()"


_SETTLED = Settled()


class Message:
    """A received message, handed to the subscription's handler.

    ``message_id`` is ``"<partition>-<stream entry id>"``, the id ``publish``
    returned. ``delivery_attempt`` is exact: 1 on the first delivery, one more
    on each redelivery. ``publish_time`` is when the server stored it (UTC).

    ``ack()``, ``nack()``, ``dead_letter(reason)`` and
    ``modify_ack_deadline(seconds)`` are plain methods, safe to call from async
    handlers, plain ``def`` handlers in the thread pool, or any other thread.
    The first of ack, nack and dead letter settles the message; later calls do
    nothing.
    """

    __slots__ = (
        "_delivered_ms",
        "_entry_id",
        "_partition",
        "_settling",
        "_size",
        "_started",
        "_token",
        "attributes",
        "data",
        "delivery_attempt",
        "ordering_key",
        "subscription",
    )

    def __init__(
        self,
        data: bytes,
        attributes: dict[str, str],
        ordering_key: str | None,
        partition: int,
        entry_id: str,
        delivery_attempt: int,
        subscription: str,
        size: int,
        delivered_ms: int,
        settling: Settling,
    ) -> None:
        self.data = data
        self.attributes = attributes
        self.ordering_key = ordering_key
        self.delivery_attempt = delivery_attempt
        self.subscription = subscription
        self._partition = partition
        self._entry_id = entry_id
        self._size = size
        self._delivered_ms = delivered_ms
        self._settling = settling
        self._started = False
        self._token = 0  # on an ordered subscription: its partition's fencing token

    @property
    def message_id(self) -> str:
        """``"<partition>-<stream entry id>"``: the id ``publish`` returned."""
        return f"{self._partition}-{self._entry_id}"

    @property
    def publish_time(self) -> datetime.datetime:
        """When the server stored the message (the stream entry id's time), UTC."""
        millis = int(self._entry_id.split("-", 1)[0])
        return datetime.datetime.fromtimestamp(millis / 1000, tz=datetime.UTC)

    @property
    def size(self) -> int:
        """Bytes of data, ordering key and attributes."""
        return self._size

    def __repr__(self) -> str:
        data = self.data if len(self.data) <= 50 else self.data[:47] + b"..."
        return (
            f"Message(message_id={self.message_id!r}, data={data!r}, "
            f"ordering_key={self.ordering_key!r}, attributes={self.attributes!r}, "
            f"delivery_attempt={self.delivery_attempt})"
        )

    def ack(self) -> Settled:
        """Acknowledge: the message is done and is not delivered again.

        Acks are sent in batches shortly after; a second ack, or an ack after a
        nack, does nothing.
        """
        self._settling.ack(self)
        return _SETTLED

    def nack(self) -> Settled:
        """Give the message back: it is delivered again after the retry policy's
        backoff, or goes to the dead-letter topic when this was its last attempt."""
        self._settling.nack(self)
        return _SETTLED

    def dead_letter(self, reason: str) -> Settled:
        """Send the message to the subscription's dead-letter topic now, with ``reason``.

        Raises :class:`FailedPreconditionError` when the subscription has none.
        """
        self._settling.dead_letter(self, reason)
        return _SETTLED

    def modify_ack_deadline(self, seconds: float) -> Settled:
        """End this message's lease ``seconds`` from now; 0 gives it back for
        redelivery at once, without the retry policy's backoff (Pub/Sub's nack).

        The lease is never held longer than the subscriber's max_lease_duration
        after receipt.
        """
        self._settling.modify_ack_deadline(self, seconds)
        return _SETTLED

    async def ack_with_response(self) -> None:
        """Acknowledge, and return once the server confirms it.

        Raises :class:`AckError` with status ``INVALID_ACK_ID`` when this
        subscriber no longer owns this delivery of the message (its lease was
        lost and another subscriber may have it): the ack did not take effect.
        Use it with subscriptions created with ``enable_exactly_once_delivery=True``.
        """
        await self._settling.ack_with_response(self)

    async def nack_with_response(self) -> None:
        """Nack, and return once the server confirms it; raises :class:`AckError`
        (``INVALID_ACK_ID``) when this delivery was no longer this subscriber's."""
        await self._settling.nack_with_response(self)
