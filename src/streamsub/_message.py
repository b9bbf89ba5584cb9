"""Messages: the outgoing form a publisher takes, and the received one a handler gets."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._engine.receiver import Receiver

__all__ = ["Message", "OutgoingMessage"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class OutgoingMessage:
    """A message to publish with ``publish_many``."""

    data: bytes
    ordering_key: str | None = None
    attributes: Mapping[str, str] | None = None


class Message:
    """A received message, handed to the subscription's handler.

    ``message_id`` is ``"<partition>-<stream entry id>"``, the id ``publish``
    returned. ``delivery_attempt`` is exact: 1 on the first delivery, one more
    on each redelivery. ``publish_time`` is when the server stored it (UTC).
    """

    __slots__ = (
        "_delivered_ms",
        "_entry_id",
        "_partition",
        "_receiver",
        "_size",
        "attributes",
        "data",
        "delivery_attempt",
        "ordering_key",
        "subscription",
    )

    def __init__(
        self,
        *,
        data: bytes,
        attributes: dict[str, str],
        ordering_key: str | None,
        partition: int,
        entry_id: str,
        delivery_attempt: int,
        subscription: str,
        size: int,
        delivered_ms: int,
        receiver: Receiver,
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
        self._receiver = receiver

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

    async def ack(self) -> None:
        """Acknowledge: the message is done and is not delivered again.

        Acks are sent in batches shortly after; a second ack, or an ack after a
        nack, does nothing.
        """
        self._receiver.settle_ack(self)

    async def ack_with_response(self) -> None:
        """Acknowledge, and return once the server confirms it.

        Raises :class:`AckError` with status ``INVALID_ACK_ID`` when this
        subscriber no longer owns the message (its lease was lost and another
        subscriber may have it): the ack did not take effect. Use it with
        subscriptions created with ``enable_exactly_once_delivery=True``.
        """
        await self._receiver.ack_with_response(self)

    async def nack(self) -> None:
        """Give the message back: it is delivered again after the retry policy's
        backoff, or goes to the dead-letter topic when this was its last attempt."""
        self._receiver.settle_nack(self)

    async def dead_letter(self, reason: str) -> None:
        """Send the message to the subscription's dead-letter topic now, with ``reason``.

        Raises :class:`FailedPreconditionError` when the subscription has none.
        """
        self._receiver.settle_dead_letter(self, reason)

    async def modify_ack_deadline(self, seconds: float) -> None:
        """End this message's lease ``seconds`` from now (0 = nack now).

        The lease is never held longer than the subscriber's max_lease_duration
        after receipt.
        """
        self._receiver.modify_ack_deadline(self, seconds)
