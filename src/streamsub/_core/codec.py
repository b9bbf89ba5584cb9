"""A message to and from stream entry fields.

An entry holds ``d`` (the data), ``k`` (the ordering key, when there is one)
and ``a:<name>`` for each attribute, so ``redis-cli XRANGE`` stays readable and
no attribute costs a serialisation step. An entry with any other field, or
without ``d``, was not written by streamsub: it is undecodable and goes to the
dead-letter topic rather than stopping the subscription.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from .._errors import InvalidArgumentError, InvalidTypeError, MessageTooLargeError

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_KEY_BYTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_ORDERING_KEY_BYTES",
    "Decoded",
    "Encoded",
    "UndecodableEntry",
    "decode",
    "encode",
]

MAX_ATTRIBUTES = 100
"""Pub/Sub's limit on attributes per message."""
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024

_DATA = b"d"
_KEY = b"k"
_ATTR = b"a:"


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    """A message ready to append: its flat field list and its size in bytes."""

    fields: list[bytes]
    size: int
    ordering_key: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Decoded:
    """What an entry held."""

    data: bytes
    ordering_key: str | None
    attributes: dict[str, str]
    size: int


class UndecodableEntry(Exception):  # noqa: N818 - an outcome, not an error raised to users
    """The entry was not written by streamsub; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(
    data: object,
    ordering_key: object = None,
    attributes: object = None,
    *,
    max_bytes: int,
) -> Encoded:
    """Check a message and encode it; raise saying what to fix if it is wrong."""
    if not isinstance(data, bytes | bytearray | memoryview):
        hint = " (encode it first, e.g. text.encode())" if isinstance(data, str) else ""
        raise InvalidTypeError(f"message data must be bytes, got {type(data).__name__}{hint}")
    payload = bytes(data)
    fields = [_DATA, payload]
    size = len(payload)
    key: str | None = None
    if ordering_key is not None:
        if not isinstance(ordering_key, str):
            raise InvalidTypeError(
                f"ordering_key must be a str or None, got {type(ordering_key).__name__}"
            )
        raw_key = ordering_key.encode()
        if len(raw_key) > MAX_ORDERING_KEY_BYTES:
            raise InvalidArgumentError(
                f"ordering_key is {len(raw_key)} bytes; the limit is {MAX_ORDERING_KEY_BYTES}"
            )
        if raw_key:
            key = ordering_key
            fields += (_KEY, raw_key)
            size += len(raw_key)
    if attributes is not None:
        size += _encode_attributes(attributes, fields)
    if size > max_bytes:
        raise MessageTooLargeError(
            f"message is {size} bytes (data, ordering key and attributes); the limit is "
            f"{max_bytes}: split it, or raise Limits.max_message_bytes"
        )
    return Encoded(fields, size, key)


def _encode_attributes(attributes: object, fields: list[bytes]) -> int:
    if not isinstance(attributes, Mapping):
        raise InvalidTypeError(
            f"attributes must be a mapping of str to str, got {type(attributes).__name__}"
        )
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidArgumentError(
            f"a message has at most {MAX_ATTRIBUTES} attributes, got {len(attributes)}"
        )
    size = 0
    for name, value in attributes.items():
        if not isinstance(name, str):
            raise InvalidTypeError(f"attribute keys must be str, got {type(name).__name__}")
        if not isinstance(value, str):
            raise InvalidTypeError(
                f"attribute {name!r} must have a str value, got {type(value).__name__}"
            )
        raw_name, raw_value = name.encode(), value.encode()
        if not raw_name or len(raw_name) > MAX_ATTRIBUTE_KEY_BYTES:
            raise InvalidArgumentError(
                f"attribute key {name!r} must be 1 to {MAX_ATTRIBUTE_KEY_BYTES} bytes"
            )
        if len(raw_value) > MAX_ATTRIBUTE_VALUE_BYTES:
            raise InvalidArgumentError(
                f"attribute {name!r} is {len(raw_value)} bytes; the limit is "
                f"{MAX_ATTRIBUTE_VALUE_BYTES}"
            )
        fields += (_ATTR + raw_name, raw_value)
        size += len(raw_name) + len(raw_value)
    return size


def decode(fields: Mapping[bytes, bytes]) -> Decoded:
    """Decode an entry's fields, or raise :class:`UndecodableEntry`."""
    data = fields.get(_DATA)
    if data is None:
        raise UndecodableEntry(f"no data field 'd' (fields: {_field_names(fields)})")
    size = len(data)
    key: str | None = None
    attributes: dict[str, str] = {}
    try:
        for name, value in fields.items():
            if name == _DATA:
                continue
            if name == _KEY:
                key = value.decode()
                size += len(value)
            elif name.startswith(_ATTR):
                attributes[name[2:].decode()] = value.decode()
                size += len(name) - 2 + len(value)
            else:
                raise UndecodableEntry(f"unknown field {name!r} (fields: {_field_names(fields)})")
    except UnicodeDecodeError as exc:
        raise UndecodableEntry(f"a key or attribute is not UTF-8: {exc}") from None
    return Decoded(data, key, attributes, size)


def _field_names(fields: Mapping[bytes, bytes]) -> str:
    return ", ".join(repr(name) for name in list(fields)[:8])
