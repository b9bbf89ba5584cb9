"""A message to and from stream entry fields.

An entry holds ``d`` (the data), ``k`` (the ordering key, when there is one)
and ``a:<name>`` for each attribute, so ``redis-cli XRANGE`` stays readable and
no attribute costs a serialisation step. An entry with any other field, or
without ``d``, was not written by streamsub: it is undecodable and goes to the
dead-letter topic rather than stopping the subscription.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .._errors import InvalidArgumentError, InvalidTypeError, MessageTooLargeError

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_KEY_BYTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_ORDERING_KEY_BYTES",
    "Decoded",
    "Encoded",
    "UndecodableEntry",
    "data_only",
    "decode",
    "encode",
    "encode_data",
    "pack_data",
    "size_of",
]

MAX_ATTRIBUTES = 100
"""Pub/Sub's limit on attributes per message."""
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024

_DATA = b"d"
_KEY = b"k"
_ATTR = b"a:"


class Encoded(NamedTuple):
    """A message ready to append: packed, its size in bytes, its ordering key.

    ``packed`` is the form a batch is sent in (one argument for the whole
    batch, see ``scripts/append.lua``): a big-endian uint16 value count, then
    each field name and value as a big-endian uint32 length and its bytes. A
    count of 0 starts a run of messages that are data alone, which Redis
    appends without a step per field: a big-endian uint32 message count, each
    message's data length as a big-endian uint32, then their data one after
    the other (a run of one: the count, the length, the data).
    """

    packed: bytes
    size: int
    ordering_key: str | None

    @property
    def fields(self) -> list[bytes]:
        """The flat field list (name, value, name, value, ...) that ``packed`` holds."""
        return unpack_fields(self.packed)


_COUNT = struct.Struct(">H")
_LEN = struct.Struct(">I")
_RUN = _COUNT.pack(0)  # then a run of messages that are data alone
_DATA_ONLY = _RUN + _LEN.pack(1)  # a run of one
_DATA_AND_KEY = _COUNT.pack(4) + _LEN.pack(1) + b"d"
_KEY_HEADER = _LEN.pack(1) + b"k"


def pack_fields(fields: list[bytes]) -> bytes:
    """Pack a flat field list in the general form of ``Encoded.packed`` (not a run)."""
    parts = [_COUNT.pack(len(fields))]
    for value in fields:
        parts += (_LEN.pack(len(value)), value)
    return b"".join(parts)


def unpack_fields(packed: bytes) -> list[bytes]:
    """The flat field lists of one or more packed messages, concatenated."""
    fields: list[bytes] = []
    pos = 0
    while pos < len(packed):
        (count,) = _COUNT.unpack_from(packed, pos)
        pos += _COUNT.size
        if count == 0:  # a run of messages that are data alone
            (run,) = _LEN.unpack_from(packed, pos)
            pos += _LEN.size
            at = pos + run * _LEN.size  # the data, behind the lengths
            for (length,) in _LEN.iter_unpack(packed[pos:at]):
                fields += (_DATA, packed[at : at + length])
                at += length
            pos = at
            continue
        for _ in range(count):
            (length,) = _LEN.unpack_from(packed, pos)
            pos += _LEN.size
            fields.append(packed[pos : pos + length])
            pos += length
    return fields


class Decoded(NamedTuple):
    """What an entry held."""

    data: bytes
    ordering_key: str | None
    attributes: dict[str, str]
    size: int


class UndecodableEntry(Exception):
    """The entry was not written by streamsub; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _utf8(what: str, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} is not valid Unicode text (a lone surrogate at index {exc.start}); "
            "pass text that encodes to UTF-8"
        ) from None


def encode(
    data: object,
    ordering_key: object = None,
    attributes: object = None,
    *,
    max_bytes: int,
) -> Encoded:
    """Check a message and encode it; raise saying what to fix if it is wrong."""
    if type(data) is bytes:
        payload = data
    elif isinstance(data, bytes | bytearray | memoryview):
        payload = bytes(data)
    else:
        hint = " (encode it first, e.g. text.encode())" if isinstance(data, str) else ""
        raise InvalidTypeError(f"message data must be bytes, got {type(data).__name__}{hint}")
    size = len(payload)
    key: str | None = None
    raw_key = b""
    if ordering_key is not None:
        if type(ordering_key) is not str:
            raise InvalidTypeError(
                f"ordering_key must be a str or None, got {type(ordering_key).__name__}"
            )
        raw_key = _utf8("ordering_key", ordering_key)
        if len(raw_key) > MAX_ORDERING_KEY_BYTES:
            raise InvalidArgumentError(
                f"ordering_key is {len(raw_key)} bytes; the limit is {MAX_ORDERING_KEY_BYTES}"
            )
        if raw_key:
            key = ordering_key
            size += len(raw_key)
    fields: list[bytes] = []
    if attributes:
        fields += (_DATA, payload)
        if key is not None:
            fields += (_KEY, raw_key)
        size += _encode_attributes(attributes, fields)
    elif attributes is not None and not isinstance(attributes, Mapping):
        raise InvalidTypeError(
            f"attributes must be a mapping of str to str, got {type(attributes).__name__}"
        )
    # Before packing: a message too large is not copied, nor (past 32-bit
    # lengths) packed at all.
    if size > max_bytes:
        raise _too_large(size, max_bytes)
    if fields:
        packed = pack_fields(fields)
    elif key is None:  # the common shapes, packed without a loop
        packed = b"".join((_DATA_ONLY, _LEN.pack(size), payload))
    else:
        packed = b"".join(
            (
                _DATA_AND_KEY,
                _LEN.pack(len(payload)),
                payload,
                _KEY_HEADER,
                _LEN.pack(len(raw_key)),
                raw_key,
            )
        )
    return Encoded(packed, size, key)


def encode_data(data: bytes, max_bytes: int) -> Encoded:
    """:func:`encode` of a message that is ``bytes`` alone (no ordering key, no
    attributes): the shape of most of a ``publish_many``, with nothing to check
    but its size."""
    size = len(data)
    if size > max_bytes:
        raise _too_large(size, max_bytes)
    return Encoded(b"".join((_DATA_ONLY, _LEN.pack(size), data)), size, None)


def pack_data(datas: Sequence[bytes], sizes: Sequence[int]) -> bytes:
    """Messages that are ``bytes`` alone, checked (each within the size limit;
    ``sizes``: their lengths), packed as one run (see :class:`Encoded`): the
    count and the lengths in one ``struct.pack``, then the data joined, with no
    step per message in Python."""
    count = len(datas)
    if count == 1:  # a single publish's, most often
        return b"".join((_DATA_ONLY, _LEN.pack(sizes[0]), datas[0]))
    return b"".join((_RUN, struct.pack(f">{count + 1}I", count, *sizes), *datas))


def _too_large(size: int, max_bytes: int) -> MessageTooLargeError:
    return MessageTooLargeError(
        f"message is {size} bytes (data, ordering key and attributes); the limit is "
        f"{max_bytes}: split it, or raise Limits.max_message_bytes"
    )


def size_of(data: object, ordering_key: object = None, attributes: object = None) -> int:
    """The size :func:`encode` counts for a message (data, ordering key, attribute
    keys and values, in bytes), without checking or packing it.

    For the blocking client's flow control, which counts a message before the
    event loop encodes it. Parts that ``encode`` would refuse count 0: that
    publish fails anyway.
    """
    if isinstance(data, memoryview):
        size = data.nbytes
    elif isinstance(data, bytes | bytearray):
        size = len(data)
    else:
        return 0
    if isinstance(ordering_key, str):
        size += len(ordering_key.encode(errors="surrogatepass"))
    if isinstance(attributes, Mapping):
        for name, value in attributes.items():
            if isinstance(name, str) and isinstance(value, str):
                size += len(name.encode(errors="surrogatepass"))
                size += len(value.encode(errors="surrogatepass"))
    return size


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
        raw_name = _utf8(f"attribute key {name!r}", name)
        raw_value = _utf8(f"attribute {name!r}", value)
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


def data_only(fields: Sequence[bytes]) -> bytes | None:
    """The data of an entry of the common shape -- data, no ordering key, no
    attributes -- else None (then :func:`decode` it). Cheaper than ``decode`` for
    the receive path, which builds the message from the data alone."""
    if len(fields) == 2 and fields[0] == _DATA:
        return fields[1]
    return None


def decode(fields: Sequence[bytes]) -> Decoded:
    """Decode an entry's flat field list (name, value, name, value, ...), as
    Redis returns it, or raise :class:`UndecodableEntry`."""
    count = len(fields)
    if count == 2 and fields[0] == _DATA:  # the common shape: no key, no attributes
        return Decoded(fields[1], None, {}, len(fields[1]))
    if count % 2:
        raise UndecodableEntry(f"an odd number of values ({count})")
    data: bytes | None = None
    key: str | None = None
    attributes: dict[str, str] = {}
    size = 0
    try:
        for i in range(0, count, 2):
            name, value = fields[i], fields[i + 1]
            if name == _DATA:
                data = value
            elif name == _KEY:
                key = value.decode() or None
                size += len(value)
            elif name.startswith(_ATTR):
                attributes[name[2:].decode()] = value.decode()
                size += len(name) - 2 + len(value)
            else:
                raise UndecodableEntry(f"unknown field {name!r} (fields: {_field_names(fields)})")
    except UnicodeDecodeError as exc:
        raise UndecodableEntry(f"a key or attribute is not UTF-8: {exc}") from None
    if data is None:
        raise UndecodableEntry(f"no data field 'd' (fields: {_field_names(fields)})")
    return Decoded(data, key, attributes, size + len(data))


def _field_names(fields: Sequence[bytes]) -> str:
    return ", ".join(repr(name) for name in fields[:16:2])
