"""What a dead letter carries: the message, and where and why it failed.

The dead letter keeps the original data, ordering key and attributes, and adds
attributes (names below) for the source topic, subscription and message id,
the delivery attempts, and the reason. The backend adds the first and last
delivery times (ms since the epoch) in the same step that acknowledges the
source, since only it knows them. An undecodable entry's data is its fields as
JSON, so nothing of it is lost.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

from .._errors import InvalidArgumentError
from .codec import Decoded, Encoded, encode

__all__ = [
    "ATTEMPTS",
    "FIRST_DELIVERY_MS",
    "LAST_DELIVERY_MS",
    "REASON",
    "SOURCE_MESSAGE_ID",
    "SOURCE_SUBSCRIPTION",
    "SOURCE_TOPIC",
    "UNDECODABLE",
    "dead_letter_message",
    "undecodable_data",
]

SOURCE_TOPIC = "streamsub.source_topic"
SOURCE_SUBSCRIPTION = "streamsub.source_subscription"
SOURCE_MESSAGE_ID = "streamsub.source_message_id"
ATTEMPTS = "streamsub.delivery_attempts"
REASON = "streamsub.dead_letter_reason"
FIRST_DELIVERY_MS = "streamsub.first_delivery_ms"
LAST_DELIVERY_MS = "streamsub.last_delivery_ms"
UNDECODABLE = "undecodable"
"""The reason given to entries that streamsub did not write."""

_MAX_REASON_BYTES = 1000
"""Attribute values are limited to 1024 bytes (UTF-8); a longer reason is cut."""


def _cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode(errors="ignore") + "..."


def undecodable_data(fields: Sequence[bytes]) -> bytes:
    """An undecodable entry's flat field list as a JSON object: text where UTF-8,
    else ``base64:...``; an odd last value gets the name ``""``."""

    def text(raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode()

    pairs = list(fields) + [b""] * (len(fields) % 2)
    return json.dumps(
        {text(pairs[i]): text(pairs[i + 1]) for i in range(0, len(pairs), 2)}
    ).encode()


def dead_letter_message(
    message: Decoded | None,
    *,
    raw_fields: Sequence[bytes],
    topic: str,
    subscription: str,
    message_id: str,
    delivery_attempts: int,
    reason: str,
) -> Encoded:
    """The dead letter for ``message`` (None when undecodable: then ``raw_fields``)."""
    reason = _cut(reason, _MAX_REASON_BYTES)
    metadata = {
        SOURCE_TOPIC: topic,
        SOURCE_SUBSCRIPTION: subscription,
        SOURCE_MESSAGE_ID: message_id,
        ATTEMPTS: str(delivery_attempts),
        REASON: reason,
    }
    if message is None:
        data, key, attributes = undecodable_data(raw_fields), None, metadata
    else:
        data, key = message.data, message.ordering_key
        attributes = {**message.attributes, **metadata}
    # The limits were checked when the message was published; a dead letter
    # must not fail for being a little larger than its source.
    try:
        return encode(data, key, attributes, max_bytes=2**62)
    except InvalidArgumentError:  # no room for the metadata beside 100 attributes
        return encode(data, key, metadata, max_bytes=2**62)
