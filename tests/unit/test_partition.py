"""Partitioning: FNV-1a placement of keyed messages, sticky round-robin for the rest."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsub._core.partition import StickyPartitioner, fnv1a_32, partition_for_key

# Go's hash/fnv New32a golden values (fnv_test.go) and the FNV reference vectors.
FNV1A_32_VECTORS = [
    (b"", 0x811C9DC5),
    (b"a", 0xE40C292C),
    (b"ab", 0x4D2505CA),
    (b"abc", 0x1A47E90B),
    (b"b", 0xE70C2DE5),
    (b"f", 0xE30C2799),
    (b"fo", 0x6222E842),
    (b"foo", 0xA9F37ED7),
    (b"foob", 0x3F5076EF),
    (b"fooba", 0x39AAA18A),
    (b"foobar", 0xBF9CF968),
]


@pytest.mark.parametrize(("data", "expected"), FNV1A_32_VECTORS)
def test_fnv1a_32_matches_published_vectors(data: bytes, expected: int) -> None:
    """fnv1a_32 gives the published FNV-1a 32-bit values, as Go's hash/fnv New32a does."""
    assert fnv1a_32(data) == expected


@given(st.binary(max_size=256))
def test_fnv1a_32_is_an_unsigned_32_bit_value(data: bytes) -> None:
    """fnv1a_32 always returns an unsigned 32-bit integer."""
    assert 0 <= fnv1a_32(data) <= 0xFFFFFFFF


def test_fnv1a_32_accepts_any_bytes_like_sequence() -> None:
    """fnv1a_32 hashes bytearray and memoryview like the same bytes."""
    assert fnv1a_32(bytearray(b"foobar")) == fnv1a_32(memoryview(b"foobar")) == 0xBF9CF968


def test_fnv1a_32_is_exported_publicly() -> None:
    """streamsub.fnv1a_32 is the function that places keys, for services that must agree."""
    import streamsub

    assert streamsub.fnv1a_32 is fnv1a_32


def test_partition_for_key_is_the_hash_modulo_partitions() -> None:
    """A keyed message goes to fnv1a_32(key) % partitions."""
    assert partition_for_key("foobar", 16) == 0xBF9CF968 % 16
    assert partition_for_key("a", 7) == 0xE40C292C % 7
    assert partition_for_key("", 5) == 0x811C9DC5 % 5


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("\u011f", 0x70900AE4),  # "ğ": UTF-8 c4 9f
        ("\U0001d11e", 0x3B79D038),  # musical G clef: UTF-8 f0 9d 84 9e, outside the BMP
        ("caf\u00e9", 0xA82B5049),
        ("\u65e5\u672c", 0x9F26EE51),  # "日本"
    ],
)
def test_partition_for_key_hashes_utf8_bytes_of_non_ascii_keys(key: str, expected: int) -> None:
    """A non-ASCII key is hashed as its UTF-8 bytes, not as code points or UTF-16 units."""
    assert fnv1a_32(key.encode("utf-8")) == expected
    assert partition_for_key(key, 2**32) == expected
    assert partition_for_key(key, 1024) == expected % 1024


def test_partition_for_key_differs_from_latin1_hashing() -> None:
    """The key "é" hashes as UTF-8 c3 a9, not as the single Latin-1 byte e9."""
    assert partition_for_key("\u00e9", 2**32) == 0x1E9DE8C1
    assert partition_for_key("\u00e9", 2**32) != fnv1a_32(b"\xe9")


@given(st.text(max_size=64), st.integers(min_value=1, max_value=1024))
def test_partition_for_key_is_in_range_and_stable(key: str, partitions: int) -> None:
    """The partition of a key is in [0, partitions) and the same on every call."""
    partition = partition_for_key(key, partitions)
    assert 0 <= partition < partitions
    assert partition_for_key(key, partitions) == partition


def test_partition_for_key_with_one_partition_is_always_zero() -> None:
    """With a single partition every key goes to partition 0."""
    assert {partition_for_key(f"key-{i}", 1) for i in range(100)} == {0}


def test_sticky_partitioner_stays_put_until_advanced() -> None:
    """Keyless messages of one batch all go to the current partition."""
    sticky = StickyPartitioner(4)
    assert [sticky.current for _ in range(10)] == [0] * 10


def test_sticky_partitioner_rotates_through_every_partition() -> None:
    """Each advance moves to the next partition and wraps after the last."""
    sticky = StickyPartitioner(4, start=2)
    seen = []
    for _ in range(9):
        seen.append(sticky.current)
        sticky.advance()
    assert seen == [2, 3, 0, 1, 2, 3, 0, 1, 2]


def test_sticky_partitioner_start_is_taken_modulo_partitions() -> None:
    """A start past the partition count (e.g. a clock value) wraps into range."""
    assert StickyPartitioner(16, start=35).current == 3
    assert StickyPartitioner(16, start=1_700_000_000_000_000_000 >> 10).current in range(16)
    assert StickyPartitioner(4, start=-1).current == 3


def test_sticky_partitioner_with_one_partition_always_gives_zero() -> None:
    """With a single partition advancing stays on partition 0."""
    sticky = StickyPartitioner(1, start=7)
    for _ in range(5):
        assert sticky.current == 0
        sticky.advance()


@given(
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=0, max_value=2**62),
    st.integers(min_value=1, max_value=5),
)
def test_sticky_partitioner_spreads_batches_evenly(
    partitions: int, start: int, rounds: int
) -> None:
    """Over whole rounds of batches every partition gets exactly the same number."""
    sticky = StickyPartitioner(partitions, start=start)
    counts: collections.Counter[int] = collections.Counter()
    for _ in range(partitions * rounds):
        counts[sticky.current] += 1
        sticky.advance()
    assert counts == dict.fromkeys(range(partitions), rounds)
