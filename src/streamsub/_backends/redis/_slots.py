"""Cluster slots, and the partition tags that spread a topic evenly over the masters.

Redis Cluster puts a key in slot ``CRC16(tag) % 16384`` (CRC-16/XMODEM of the
hash tag, the text between the key's first ``{`` and the next ``}``). Plain
tags ``orders.0`` … ``orders.15`` land where the hash sends them: measured, 7/6/3
on three masters. So a topic created on a cluster gives partition ``p`` the
master ``(p + offset) % M`` of the ``M`` masters serving slots at that moment
(sorted by their first slot; ``offset`` from the topic's name, so that many
topics do not all load the first master most), and the smallest salt ``s``
whose tag ``<topic>.<p>|<s>`` (``s = 0``: the plain tag) hashes into one of
that master's slots. With each master serving about ``1/M`` of the slots a
salt is found after about ``M`` tries. No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._keys import partition_tag

__all__ = ["SLOTS", "balanced_salts", "key_slot"]

SLOTS = 16384
_MAX_SALT = 1_000_000
"""Salts tried before giving up (a master with a handful of slots may need many)."""


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM, as Redis Cluster computes it."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(key: str) -> int:
    """The cluster slot of ``key`` (by its hash tag when it has a non-empty one)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key.encode()) % SLOTS


def balanced_salts(
    topic: str, partitions: int, masters: Sequence[Sequence[tuple[int, int]]]
) -> tuple[int, ...]:
    """Per partition, the salt that puts its tag on its share of ``masters``.

    ``masters`` holds each master's slot ranges (inclusive). Partition ``p``
    goes to master ``(p + offset) % len(masters)``, so every master gets
    ``partitions // M`` or one more.
    """
    if not masters:
        raise ValueError("a cluster with no master serving slots")
    owner = [-1] * SLOTS
    ordered = sorted(masters, key=lambda ranges: min(first for first, _ in ranges))
    for index, ranges in enumerate(ordered):
        for first, last in ranges:
            for slot in range(first, last + 1):
                owner[slot] = index
    offset = crc16(topic.encode()) % len(ordered)
    salts = []
    for partition in range(partitions):
        wanted = (partition + offset) % len(ordered)
        for salt in range(_MAX_SALT):
            if owner[key_slot("{" + partition_tag(topic, partition, salt) + "}")] == wanted:
                salts.append(salt)
                break
        else:
            raise ValueError(f"no tag for partition {partition} lands on master {wanted}")
    return tuple(salts)
