"""Seek: where each partition of a subscription goes, for each kind of target.

A seek moves a subscription's position on every partition (the consumer
group's last-delivered id) and settles its pending entries the way Pub/Sub's
seek does: messages before the point count as acknowledged, messages at or
after it as not acknowledged (delivered again). The targets:

- a time (an aware ``datetime``): every partition goes to just before the first
  entry id of that millisecond, so every retained message published at or
  after it is delivered again;
- ``"earliest"``: to the start, every retained message is delivered again;
- ``"latest"``: to the end, nothing is delivered again and every pending
  message counts as acknowledged;
- a message id ``"<partition>-<ms>-<seq>"``: its partition to just before it,
  the other partitions to its time, so that message and everything published
  after it are delivered again;
- a snapshot: every partition back to its last-delivered id when the snapshot
  was taken; the messages pending then are delivered again (if still
  retained), those acknowledged then count as acknowledged.

This module only plans; the backend applies each partition's plan in one
atomic step. No I/O, plain values.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence

from .._errors import InvalidArgumentError, InvalidTypeError
from .streamid import id_at, parse_id, predecessor

__all__ = [
    "END",
    "MAX_SNAPSHOT_PENDING",
    "SNAPSHOT_LIFETIME",
    "PartitionPosition",
    "PartitionSeek",
    "SeekResult",
    "Snapshot",
    "is_snapshot_name",
    "plan_seek",
    "positions_from_json",
    "positions_json",
    "split_message_id",
]

END = "$"
"""The position after the last entry of a stream."""
SNAPSHOT_LIFETIME = 7 * 86_400.0
"""Seconds a snapshot lives (Pub/Sub's limit): until then it holds back
retention on its topic, so a seek to it finds what it recorded."""
MAX_SNAPSHOT_PENDING = 100_000
"""Pending ids a snapshot records per partition at most; a subscription with
more pending on one partition cannot be snapshotted (ack or seek first)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionPosition:
    """A subscription's state on one partition, as a snapshot keeps it."""

    last_delivered_id: str
    pending: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionSeek:
    """What a seek does to one partition: move the group to ``position`` (an id or
    ``END``); acknowledge pending entries at or below it except ``redeliver``,
    which are delivered again."""

    position: str
    redeliver: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class SeekResult:
    """What a seek did, over all partitions."""

    subscription: str
    acknowledged: int
    """Pending messages that now count as acknowledged (they were before the point)."""
    redelivered_pending: int
    """Messages a snapshot seek made pending again, to be delivered again at once
    (messages after the point are delivered again by reading, not counted here)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """A subscription's acknowledgement state at one moment, to seek back to."""

    name: str
    subscription: str
    topic: str
    created: datetime.datetime
    expires: datetime.datetime
    """Seven days after ``created``; until then it keeps its messages from retention."""


def is_snapshot_name(to: str) -> bool:
    """A seek target that names a snapshot: names start with a letter, message
    ids with a digit; ``earliest`` and ``latest`` are reserved."""
    return to not in ("earliest", "latest") and to[:1].isalpha()


def split_message_id(message_id: str) -> tuple[int, str]:
    """``"<partition>-<ms>-<seq>"`` as (partition, entry id)."""
    partition, _, entry_id = message_id.partition("-")
    if not partition.isdigit() or not entry_id:
        raise InvalidArgumentError(
            f"{message_id!r} is not a message id: use '<partition>-<ms>-<seq>' as publish returns"
        )
    parse_id(entry_id)
    return int(partition), entry_id


def plan_seek(
    to: object,
    partitions: int,
    snapshot: Mapping[int, PartitionPosition] | None = None,
) -> dict[int, PartitionSeek]:
    """Each partition's seek for target ``to`` (a snapshot's positions come in
    ``snapshot``, ``to`` then being its name)."""
    if snapshot is not None:
        return {
            p: PartitionSeek(pos.last_delivered_id, pos.pending)
            for p, pos in snapshot.items()
            if p < partitions
        }
    if isinstance(to, datetime.datetime):
        if to.tzinfo is None:
            raise InvalidArgumentError(
                "seek to a datetime needs a time zone (e.g. datetime.now(timezone.utc))"
            )
        position = predecessor(id_at(to.timestamp()))
        return dict.fromkeys(range(partitions), PartitionSeek(position))
    if not isinstance(to, str):
        raise InvalidTypeError(
            "seek target must be a datetime, 'earliest', 'latest', a message id or a "
            f"snapshot name, got {to!r}"
        )
    if to == "earliest":
        return dict.fromkeys(range(partitions), PartitionSeek("0-0"))
    if to == "latest":
        return dict.fromkeys(range(partitions), PartitionSeek(END))
    partition, entry_id = split_message_id(to)
    if partition >= partitions:
        raise InvalidArgumentError(
            f"message id {to!r} names partition {partition}; the topic has {partitions}"
        )
    ms = parse_id(entry_id)[0]
    plans = dict.fromkeys(range(partitions), PartitionSeek(predecessor(f"{ms}-0")))
    plans[partition] = PartitionSeek(predecessor(entry_id))
    return plans


def positions_json(positions: Mapping[int, PartitionPosition]) -> dict[str, object]:
    """Snapshot positions as plain values."""
    return {str(p): [pos.last_delivered_id, list(pos.pending)] for p, pos in positions.items()}


def positions_from_json(values: Mapping[str, Sequence[object]]) -> dict[int, PartitionPosition]:
    """Snapshot positions stored as :func:`positions_json` wrote them."""
    return {
        int(p): PartitionPosition(str(v[0]), tuple(str(i) for i in v[1]))  # type: ignore[attr-defined]
        for p, v in values.items()
    }
