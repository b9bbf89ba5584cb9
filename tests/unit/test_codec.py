"""The codec: messages to stream entry fields and back, and every bad input refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsub._core.codec import (
    MAX_ATTRIBUTE_KEY_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_ORDERING_KEY_BYTES,
    Decoded,
    UndecodableEntry,
    data_only,
    decode,
    encode,
    encode_data,
    pack_data,
    size_of,
    unpack_fields,
)
from streamsub._errors import (
    InvalidArgumentError,
    InvalidTypeError,
    MessageTooLargeError,
    StreamsubError,
)

BIG = 10_000_000


def as_entry(fields: list[bytes]) -> list[bytes]:
    """The flat field list Redis hands back for an entry appended with ``fields``."""
    return list(fields)


def round_trip(data: object, ordering_key: object = None, attributes: object = None) -> Decoded:
    """Encode a message, then decode the entry it becomes."""
    return decode(as_entry(encode(data, ordering_key, attributes, max_bytes=BIG).fields))


# --- encoding --------------------------------------------------------------------


def test_encode_lays_out_data_key_and_attributes_as_readable_fields() -> None:
    """An entry holds d, then k, then a:<name> per attribute, readable in redis-cli."""
    encoded = encode(b"hi", "cust-7", {"color": "red"}, max_bytes=BIG)
    assert encoded.fields == [b"d", b"hi", b"k", b"cust-7", b"a:color", b"red"]
    assert encoded.ordering_key == "cust-7"


def test_encode_size_counts_data_key_and_attributes() -> None:
    """The encoded size is the bytes of data, ordering key, attribute names and values."""
    encoded = encode(b"12345", "ab", {"xy": "\u00e9"}, max_bytes=BIG)
    assert encoded.size == 5 + 2 + 2 + 2


def test_encode_without_key_or_attributes_is_data_only() -> None:
    """A bare message is just its data field."""
    encoded = encode(b"", max_bytes=BIG)
    assert encoded.fields == [b"d", b""]
    assert encoded.size == 0
    assert encoded.ordering_key is None


def test_encode_treats_an_empty_ordering_key_as_none() -> None:
    """An empty ordering key means no key, as in Pub/Sub."""
    encoded = encode(b"x", "", max_bytes=BIG)
    assert encoded.ordering_key is None
    assert b"k" not in encoded.fields


@pytest.mark.parametrize("data", [bytearray(b"abc"), memoryview(b"abc")])
def test_encode_accepts_bytes_like_data(data: bytearray | memoryview) -> None:
    """bytearray and memoryview data are copied into bytes."""
    encoded = encode(data, max_bytes=BIG)
    assert encoded.fields == [b"d", b"abc"]
    assert type(encoded.fields[1]) is bytes


def test_encode_accepts_a_message_of_exactly_max_bytes() -> None:
    """A message whose encoded size equals max_bytes is allowed."""
    assert encode(b"x" * 6, "ab", {"k": "v"}, max_bytes=10).size == 10


def test_encode_accepts_the_limits_exactly() -> None:
    """Ordering key, attribute count, key and value lengths at their limits are allowed."""
    attributes = {f"k{i}": "v" for i in range(MAX_ATTRIBUTES - 1)}
    attributes["n" * MAX_ATTRIBUTE_KEY_BYTES] = "v" * MAX_ATTRIBUTE_VALUE_BYTES
    encoded = encode(b"", "o" * MAX_ORDERING_KEY_BYTES, attributes, max_bytes=BIG)
    assert len(encoded.fields) == 2 + 2 + 2 * MAX_ATTRIBUTES


def test_encode_rejects_str_data_with_a_hint_to_encode_it() -> None:
    """str data is refused with a hint to call .encode() first."""
    with pytest.raises(InvalidTypeError, match=r"must be bytes, got str.*\.encode\(\)"):
        encode("hello", max_bytes=BIG)


@pytest.mark.parametrize("data", [None, 42, ["a"], {"d": b"x"}])
def test_encode_rejects_non_bytes_data_naming_the_type(data: object) -> None:
    """Data of any other type is refused, naming the type received."""
    with pytest.raises(InvalidTypeError, match=f"must be bytes, got {type(data).__name__}$"):
        encode(data, max_bytes=BIG)


@pytest.mark.parametrize("key", [b"cust-7", 7, ["k"]])
def test_encode_rejects_a_non_str_ordering_key(key: object) -> None:
    """An ordering key that is not a str (or None) is refused, naming the type."""
    with pytest.raises(
        InvalidTypeError, match=f"ordering_key must be a str or None, got {type(key).__name__}"
    ):
        encode(b"x", key, max_bytes=BIG)


def test_encode_rejects_an_ordering_key_over_the_limit() -> None:
    """An ordering key longer than 1024 UTF-8 bytes is refused with its length and the limit."""
    with pytest.raises(InvalidArgumentError, match="ordering_key is 1025 bytes; the limit is 1024"):
        encode(b"x", "o" * (MAX_ORDERING_KEY_BYTES + 1), max_bytes=BIG)


def test_encode_measures_the_ordering_key_in_utf8_bytes() -> None:
    """The ordering key limit counts UTF-8 bytes, so 513 two-byte characters are too many."""
    with pytest.raises(InvalidArgumentError, match="ordering_key is 1026 bytes"):
        encode(b"x", "\u00e9" * 513, max_bytes=BIG)


@pytest.mark.parametrize("attributes", [[("k", "v")], "k=v", 3])
def test_encode_rejects_attributes_that_are_not_a_mapping(attributes: object) -> None:
    """Attributes must be a mapping; anything else is refused, naming the type."""
    with pytest.raises(InvalidTypeError, match="attributes must be a mapping of str to str, got"):
        encode(b"x", attributes=attributes, max_bytes=BIG)


@pytest.mark.parametrize("name", [b"color", 1, None])
def test_encode_rejects_non_str_attribute_keys(name: object) -> None:
    """An attribute key that is not a str is refused, naming the type."""
    with pytest.raises(
        InvalidTypeError, match=f"attribute keys must be str, got {type(name).__name__}"
    ):
        encode(b"x", attributes={name: "v"}, max_bytes=BIG)


@pytest.mark.parametrize("value", [b"red", 1, None])
def test_encode_rejects_non_str_attribute_values(value: object) -> None:
    """An attribute value that is not a str is refused, naming the attribute and the type."""
    with pytest.raises(
        InvalidTypeError,
        match=f"attribute 'color' must have a str value, got {type(value).__name__}",
    ):
        encode(b"x", attributes={"color": value}, max_bytes=BIG)


def test_encode_rejects_too_many_attributes() -> None:
    """More than 100 attributes are refused with the count and the limit."""
    attributes = {f"k{i}": "v" for i in range(MAX_ATTRIBUTES + 1)}
    with pytest.raises(InvalidArgumentError, match="at most 100 attributes, got 101"):
        encode(b"x", attributes=attributes, max_bytes=BIG)


def test_encode_rejects_an_attribute_key_over_the_limit() -> None:
    """An attribute key longer than 256 bytes is refused, stating the allowed length."""
    with pytest.raises(InvalidArgumentError, match="must be 1 to 256 bytes"):
        encode(b"x", attributes={"n" * (MAX_ATTRIBUTE_KEY_BYTES + 1): "v"}, max_bytes=BIG)


def test_encode_rejects_an_empty_attribute_key() -> None:
    """An empty attribute key is refused, stating the allowed length."""
    with pytest.raises(InvalidArgumentError, match="attribute key '' must be 1 to 256 bytes"):
        encode(b"x", attributes={"": "v"}, max_bytes=BIG)


def test_encode_rejects_an_attribute_value_over_the_limit() -> None:
    """An attribute value longer than 1024 bytes is refused with its length and the limit."""
    with pytest.raises(
        InvalidArgumentError, match="attribute 'n' is 1025 bytes; the limit is 1024"
    ):
        encode(b"x", attributes={"n": "v" * (MAX_ATTRIBUTE_VALUE_BYTES + 1)}, max_bytes=BIG)


def test_encode_rejects_a_message_over_max_bytes() -> None:
    """A message over max_bytes raises MessageTooLargeError saying how to fix it."""
    with pytest.raises(
        MessageTooLargeError,
        match=r"message is 11 bytes .*the limit is 10: split it, or raise Limits",
    ):
        encode(b"x" * 7, "ab", {"k": "v"}, max_bytes=10)


def test_message_too_large_is_bad_input() -> None:
    """MessageTooLargeError is an InvalidArgumentError, so callers may treat it as bad input."""
    with pytest.raises(InvalidArgumentError):
        encode(b"x" * 11, max_bytes=10)


@pytest.mark.parametrize(
    ("ordering_key", "attributes"),
    [("\ud800", None), (None, {"\udc00": "v"}), (None, {"k": "bad \udfff"})],
    ids=["ordering-key", "attribute-key", "attribute-value"],
)
def test_encode_rejects_strings_that_are_not_valid_unicode(
    ordering_key: str | None, attributes: dict[str, str] | None
) -> None:
    """A lone surrogate in a key or attribute is bad input (InvalidArgumentError), not a crash."""
    with pytest.raises(InvalidArgumentError):
        encode(b"x", ordering_key, attributes, max_bytes=BIG)


# --- decoding --------------------------------------------------------------------


def test_round_trip_keeps_data_key_attributes_and_size() -> None:
    """An encoded message decodes to the same data, ordering key, attributes and size."""
    decoded = round_trip(b"\x00\xffpayload", "cust-\u00e9", {"color": "red", "n\u00e9": "\u65e5"})
    assert decoded == Decoded(
        data=b"\x00\xffpayload",
        ordering_key="cust-\u00e9",
        attributes={"color": "red", "n\u00e9": "\u65e5"},
        size=9 + 7 + (5 + 3) + (3 + 3),  # UTF-8 bytes of data, key, names and values
    )


def test_round_trip_of_a_bare_message_has_no_key_and_no_attributes() -> None:
    """A message without key or attributes decodes with ordering_key None and no attributes."""
    assert round_trip(b"x") == Decoded(b"x", None, {}, 1)


_text = st.text(max_size=40)
_attribute_names = st.text(min_size=1, max_size=40)


@given(
    data=st.binary(max_size=512),
    ordering_key=st.none() | _text,
    attributes=st.none() | st.dictionaries(_attribute_names, _text, max_size=20),
)
def test_round_trip_of_arbitrary_messages(
    data: bytes, ordering_key: str | None, attributes: dict[str, str] | None
) -> None:
    """Any valid message decodes to what was encoded, with the size encode measured."""
    encoded = encode(data, ordering_key, attributes, max_bytes=BIG)
    decoded = decode(as_entry(encoded.fields))
    assert decoded.data == data
    assert decoded.ordering_key == (ordering_key or None)
    assert decoded.ordering_key == encoded.ordering_key
    assert decoded.attributes == (attributes or {})
    assert decoded.size == encoded.size


@given(
    data=st.binary(max_size=64),
    ordering_key=st.none() | _text,
    attributes=st.none() | st.dictionaries(_attribute_names, _text, max_size=5),
    max_bytes=st.integers(min_value=1, max_value=300),
)
def test_encode_accepts_exactly_the_messages_within_max_bytes(
    data: bytes, ordering_key: str | None, attributes: dict[str, str] | None, max_bytes: int
) -> None:
    """encode succeeds iff the encoded size is at most max_bytes, else MessageTooLargeError."""
    size = encode(data, ordering_key, attributes, max_bytes=BIG).size
    if size <= max_bytes:
        assert encode(data, ordering_key, attributes, max_bytes=max_bytes).size == size
    else:
        with pytest.raises(MessageTooLargeError):
            encode(data, ordering_key, attributes, max_bytes=max_bytes)


def test_data_only_gives_the_data_of_the_common_shape_alone() -> None:
    """data_only returns the data of an entry holding only data, and None for any
    other shape (a key, attributes, fields in another order, not ours), which
    decode then handles."""
    assert data_only([b"d", b"payload"]) == b"payload"
    assert data_only(encode(b"", max_bytes=10).fields) == b""
    assert data_only(encode(b"x", "key", max_bytes=10).fields) is None
    assert data_only(encode(b"x", attributes={"a": "b"}, max_bytes=10).fields) is None
    assert data_only([b"k", b"key"]) is None
    assert data_only([b"other", b"x"]) is None
    assert data_only([]) is None


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=40),
            st.none() | st.text(min_size=1, max_size=5),
            st.dictionaries(st.text(min_size=1, max_size=4), st.text(max_size=4), max_size=2),
            st.integers(min_value=0, max_value=4),
        ),
        max_size=12,
    )
)
def test_runs_of_data_alone_and_other_shapes_concatenate_as_a_batch_does(
    messages: list[tuple[bytes, str | None, dict[str, str], int]],
) -> None:
    """A batch joins the packed forms of single publishes (data alone, or with a
    key or attributes) and of publish_many's runs of data alone (any length,
    empty data included); unpacked, it gives every message's fields in order
    (what append.lua reads; the integration tests check what it stores)."""
    parts: list[bytes] = []
    expected: list[bytes] = []
    for data, key, attributes, run in messages:
        if run:  # a run of `run` messages of different lengths, from this data
            datas = [data + bytes([i]) * i for i in range(run)]
            parts.append(pack_data(datas, [len(d) for d in datas]))
            expected += [field for d in datas for field in (b"d", d)]
        else:
            encoded = encode(data, key, attributes, max_bytes=BIG)
            parts.append(encoded.packed)
            expected += encoded.fields
    assert unpack_fields(b"".join(parts)) == expected
    assert encode_data(b"xy", 2).fields == encode(b"xy", max_bytes=2).fields == [b"d", b"xy"]


def test_decode_reads_fields_in_any_order() -> None:
    """Field order in the entry does not matter."""
    decoded = decode([b"a:x", b"1", b"k", b"key", b"d", b"data"])
    assert decoded == Decoded(b"data", "key", {"x": "1"}, 4 + 3 + 1 + 1)


def test_decode_keeps_data_that_is_not_utf8() -> None:
    """Data is opaque bytes, so non-UTF-8 data decodes fine."""
    assert decode([b"d", b"\xff\xfe"]).data == b"\xff\xfe"


def test_decode_of_an_entry_without_data_is_undecodable() -> None:
    """An entry without the 'd' field is undecodable, and the reason lists its fields."""
    with pytest.raises(
        UndecodableEntry, match=r"no data field 'd' \(fields: b'k', b'a:x'\)"
    ) as info:
        decode([b"k", b"key", b"a:x", b"1"])
    assert "no data field 'd'" in info.value.reason


def test_decode_of_an_odd_field_list_is_undecodable() -> None:
    """A field list with a name but no value is undecodable, saying so."""
    with pytest.raises(UndecodableEntry, match="odd number"):
        decode([b"d", b"x", b"k"])


def test_decode_of_an_empty_entry_is_undecodable() -> None:
    """An entry with no fields at all is undecodable."""
    with pytest.raises(UndecodableEntry, match="no data field 'd'"):
        decode([])


@pytest.mark.parametrize("field", [b"payload", b"D", b"a", b"kk"])
def test_decode_of_a_foreign_field_is_undecodable(field: bytes) -> None:
    """A field streamsub never writes makes the entry undecodable, naming the field."""
    with pytest.raises(UndecodableEntry) as info:
        decode([b"d", b"x", field, b"v"])
    assert info.value.reason.startswith(f"unknown field {field!r}")
    assert str(info.value) == info.value.reason


def test_decode_lists_at_most_eight_field_names_in_the_reason() -> None:
    """The reason of an entry with many foreign fields stays short (eight names at most)."""
    fields = [part for i in range(20) for part in (f"f{i}".encode(), b"v")]
    with pytest.raises(UndecodableEntry) as info:
        decode(fields)
    assert "b'f7'" in info.value.reason
    assert "b'f8'" not in info.value.reason


@pytest.mark.parametrize(
    "fields",
    [
        [b"d", b"x", b"k", b"\xff"],
        [b"d", b"x", b"a:\xc3", b"v"],
        [b"d", b"x", b"a:name", b"\xe9t\xe9"],
    ],
    ids=["ordering-key", "attribute-name", "attribute-value"],
)
def test_decode_of_non_utf8_key_or_attribute_is_undecodable(fields: list[bytes]) -> None:
    """A key or attribute that is not UTF-8 makes the entry undecodable, saying so."""
    with pytest.raises(UndecodableEntry, match="not UTF-8") as info:
        decode(fields)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


def test_undecodable_entry_is_not_a_streamsub_error() -> None:
    """UndecodableEntry is an outcome for the engine, not an error raised to users."""
    assert not issubclass(UndecodableEntry, StreamsubError)


@pytest.mark.parametrize(
    ("data", "key", "attributes"),
    [
        (b"plain", None, None),
        (bytearray(b"\x00" * 300), "customer-\u00e9", None),
        (memoryview(b"abcdef")[1:4], "k", {"name": "v\u00e9", "second": ""}),
        (b"", "k", {}),
    ],
)
def test_size_of_counts_what_encode_counts(
    data: object, key: str | None, attributes: object
) -> None:
    """size_of, which the blocking client's flow control uses before encoding, gives
    the size encode counts for the same message."""
    assert size_of(data, key, attributes) == encode(data, key, attributes, max_bytes=2**20).size
