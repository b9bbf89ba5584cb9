"""Stream entry ids as text (``"<ms>-<seq>"``): order, neighbours, and times.

Redis orders entry ids by milliseconds, then sequence; an id's first part is
the time the entry was added (unless a producer chose its own ids). Retention
and seek both reason in these terms.
"""

from __future__ import annotations

import math

from .._errors import InvalidArgumentError

__all__ = [
    "MAX_SEQ",
    "compare_ids",
    "id_at",
    "id_ms",
    "min_id",
    "parse_id",
    "predecessor",
    "successor",
]

MAX_SEQ = 2**64 - 1
"""The largest sequence part Redis accepts."""


def parse_id(entry_id: str) -> tuple[int, int]:
    """``"<ms>-<seq>"`` as a pair that sorts as Redis sorts ids."""
    ms, _, seq = entry_id.partition("-")
    try:
        parsed = int(ms), int(seq or 0)
    except ValueError:
        parsed = (-1, -1)
    if parsed[0] < 0 or parsed[1] < 0 or not ms.isdigit() or not (seq or "0").isdigit():
        raise InvalidArgumentError(
            f"{entry_id!r} is not a stream entry id: use '<milliseconds>-<sequence>'"
        )
    return parsed


def compare_ids(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` sorts before, with or after ``b``."""
    pa, pb = parse_id(a), parse_id(b)
    return (pa > pb) - (pa < pb)


def min_id(ids: list[str]) -> str:
    """The lowest of ``ids`` (not empty)."""
    return min(ids, key=parse_id)


def successor(entry_id: str) -> str:
    """The smallest id after ``entry_id``."""
    ms, seq = parse_id(entry_id)
    return f"{ms + 1}-0" if seq == MAX_SEQ else f"{ms}-{seq + 1}"


def predecessor(entry_id: str) -> str:
    """The largest id before ``entry_id`` (``"0-0"`` stays ``"0-0"``)."""
    ms, seq = parse_id(entry_id)
    if seq > 0:
        return f"{ms}-{seq - 1}"
    return "0-0" if ms == 0 else f"{ms - 1}-{MAX_SEQ}"


def id_at(seconds: float) -> str:
    """The first id of the millisecond at ``seconds`` since the epoch."""
    return f"{max(0, math.floor(seconds * 1000))}-0"


def id_ms(entry_id: str) -> int:
    """The millisecond time an id carries."""
    return parse_id(entry_id)[0]
