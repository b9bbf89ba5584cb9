"""Cluster slots and the partition tags that balance a topic over the masters (no server)."""

from __future__ import annotations

import collections

import pytest

from streamsub._backends.redis import _keys
from streamsub._backends.redis._slots import balanced_salts, crc16, key_slot

THREE = [[(0, 5460)], [(5461, 10922)], [(10923, 16383)]]


def master_of(slot: int, masters: list[list[tuple[int, int]]]) -> int:
    return next(i for i, ranges in enumerate(masters) if any(a <= slot <= b for a, b in ranges))


def test_crc16_and_key_slot_match_redis_cluster() -> None:
    """CRC-16/XMODEM's check value, and the slots the Redis Cluster spec gives."""
    assert crc16(b"123456789") == 0x31C3
    assert key_slot("foo") == 12182
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("foo{}{bar}") == crc16(b"foo{}{bar}") % 16384  # empty tag: whole key
    assert key_slot("foo{{bar}}zap") == crc16(b"{bar") % 16384


def test_plain_tags_do_not_balance_but_salted_ones_do() -> None:
    """Plain tags put 16 partitions 7/6/3 on three masters (as measured on a real
    cluster); the chosen salts put 5 or 6 on each, for many topic names."""
    plain = collections.Counter(master_of(key_slot(f"{{t.{p}}}"), THREE) for p in range(16))
    assert sorted(plain.values()) == [3, 6, 7]
    for name in ("orders", "t", "billing-events", "a.b~c", "x" * 255):
        salts = balanced_salts(name, 16, THREE)
        counts = collections.Counter(
            master_of(key_slot("{" + _keys.partition_tag(name, p, s) + "}"), THREE)
            for p, s in enumerate(salts)
        )
        assert sorted(counts.values()) == [5, 5, 6], name


@pytest.mark.parametrize(("partitions", "masters"), [(1, 3), (16, 1), (7, 7), (1024, 5), (40, 4)])
def test_every_master_gets_its_share(partitions: int, masters: int) -> None:
    """Each of M masters (uneven, split slot ranges too) gets P // M or one more."""
    per = 16384 // masters
    ranges = [[(i * per, (i + 1) * per - 1)] for i in range(masters)]
    ranges[-1] = [(ranges[-1][0][0], 16383)]
    if masters > 1:  # a master serving two separate ranges
        ranges[0], ranges[1] = (
            [ranges[0][0], (ranges[1][0][1], ranges[1][0][1])],
            [(ranges[1][0][0], ranges[1][0][1] - 1)],
        )
    salts = balanced_salts("orders", partitions, ranges)
    counts = collections.Counter(
        master_of(key_slot("{" + _keys.partition_tag("orders", p, s) + "}"), ranges)
        for p, s in enumerate(salts)
    )
    assert sum(counts.values()) == partitions
    assert all(partitions // masters <= n <= partitions // masters + 1 for n in counts.values())


def test_salt_zero_keeps_the_plain_key_and_tags_never_collide() -> None:
    """Salt 0 names the layout-v1 key; a salted tag cannot be another topic's
    plain tag, since topic names hold no '|'."""
    assert _keys.stream_key(_keys.partition_tag("orders", 3, 0)) == "ss:{orders.3}"
    assert _keys.stream_key(_keys.partition_tag("orders", 3, 7)) == "ss:{orders.3|7}"
    assert _keys.delay_key(_keys.partition_tag("orders", 3, 7), "g") == "ss:{orders.3|7}:delay:g"


def test_no_master_is_a_clear_error() -> None:
    """A cluster that serves no slot cannot place a topic."""
    with pytest.raises(ValueError, match="no master"):
        balanced_salts("orders", 4, [])
