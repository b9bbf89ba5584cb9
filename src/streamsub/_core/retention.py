"""Retention: how long a topic keeps its messages, and where a trim may stop.

A topic's :class:`Retention` bounds its streams by age and by length. A trim
never passes a partition's *safe point* — the lowest, over every subscription
(consumer group), of its first pending entry and of the entry after its last
delivered one — unless the policy says
``drop_unacked=True``; then what it drops unacknowledged is counted.

The functions here are the policy's arithmetic on plain values (stream entry
ids as ``"<ms>-<seq>"`` text): no I/O. Ages are judged in the trim step by the
server's clock, never the client's.
The backend applies the bound atomically per partition (the safe point is
read in the same server-side step that trims, so a subscription cannot fall
behind it in between).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from .._errors import InvalidArgumentError, InvalidTypeError
from .streamid import min_id, successor

__all__ = [
    "DEFAULT_RETENTION_INTERVAL",
    "LOCK_TTL",
    "MAX_AGE_LIMIT",
    "TRIM_BATCH",
    "GroupPosition",
    "PartitionTrim",
    "Retention",
    "RetentionResult",
    "floor_of",
    "safe_point",
]

DEFAULT_RETENTION_INTERVAL = 5.0
"""Seconds between a background trimmer's passes: acknowledged entries beyond
the policy go within about this long."""
LOCK_TTL = 30.0
"""Seconds a topic's trimmer lock lasts after it was taken or last extended (the
trimmer extends it after every step, so a long pass keeps it); a crashed
trimmer's lock expires after this. Overlapping passes are harmless (each
partition's trim is one atomic step), the lock only saves the work."""
TRIM_BATCH = 10_000
"""Entries one server-side trim step deletes at most, so that no single step
blocks Redis for long; a pass repeats the step until a partition is done."""
MAX_AGE_LIMIT = 366 * 86_400.0
"""The longest ``max_age`` (a year and a day), so a typo of units is caught."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Retention:
    """How much of a topic its streams keep; ``None`` means no bound of that kind.

    ``max_age`` (seconds, default None): entries older than this go.
    ``max_length`` (entries per partition, default None): the oldest entries
    beyond this many go. Either way only entries every subscription has
    acknowledged are deleted, unless ``drop_unacked`` (default False) is set:
    then the policy is a hard cap that protects Redis memory, and every
    unacknowledged entry it deletes (pending, or not yet delivered to some
    subscription) is counted in the topic's ``dropped_unacked`` statistic.
    """

    max_age: float | None = None
    max_length: int | None = None
    drop_unacked: bool = False

    def __post_init__(self) -> None:
        if self.max_age is not None:
            if isinstance(self.max_age, bool) or not isinstance(self.max_age, int | float):
                raise InvalidTypeError(
                    f"Retention.max_age must be seconds (a number) or None, got {self.max_age!r}"
                )
            if not 0 < self.max_age <= MAX_AGE_LIMIT or math.isnan(self.max_age):
                raise InvalidArgumentError(
                    f"Retention.max_age must be seconds > 0 and <= {MAX_AGE_LIMIT:.0f} "
                    f"(366 days), got {self.max_age!r}"
                )
        if self.max_length is not None:
            if isinstance(self.max_length, bool) or not isinstance(self.max_length, int):
                raise InvalidTypeError(
                    f"Retention.max_length must be an int or None, got {self.max_length!r}"
                )
            if self.max_length < 1:
                raise InvalidArgumentError(
                    f"Retention.max_length must be >= 1 entries per partition, "
                    f"got {self.max_length!r}"
                )
        if not isinstance(self.drop_unacked, bool):
            raise InvalidTypeError(
                f"Retention.drop_unacked must be a bool, got {self.drop_unacked!r}"
            )

    @property
    def bounded(self) -> bool:
        """True when the policy bounds anything (age or length)."""
        return self.max_age is not None or self.max_length is not None

    def to_dict(self) -> dict[str, object]:
        """Plain values, as stored with the topic."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> Retention:
        """The policy stored as :meth:`to_dict` wrote it."""
        max_age, max_length = values.get("max_age"), values.get("max_length")
        return cls(
            max_age=None if max_age is None else float(max_age),  # type: ignore[arg-type]
            max_length=None if max_length is None else int(max_length),  # type: ignore[call-overload]
            drop_unacked=bool(values.get("drop_unacked", False)),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class GroupPosition:
    """Where one subscription stands on one partition."""

    last_delivered_id: str
    first_pending_id: str | None
    """None when nothing is pending."""

    @property
    def needs_from(self) -> str:
        """The smallest id this subscription may still need: the lower of its first
        pending id and the id after its last delivered one (after a seek
        backwards the group reads again from below what it has pending)."""
        after = successor(self.last_delivered_id)
        if self.first_pending_id is None:
            return after
        return min_id([self.first_pending_id, after])


def floor_of(positions: Iterable[tuple[str, Sequence[str]]]) -> str | None:
    """The lowest id that recorded positions (last delivered id, pending ids), as
    snapshots keep them, still need; None when there are none."""
    return safe_point(
        GroupPosition(last, min_id(list(pending)) if pending else None)
        for last, pending in positions
    )


def safe_point(groups: Iterable[GroupPosition]) -> str | None:
    """The lowest id any subscription may still need (entries below it may go),
    or None when there is no subscription (no bound)."""
    points = [g.needs_from for g in groups]
    return min_id(points) if points else None


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionTrim:
    """What one pass deleted from one partition."""

    partition: int
    trimmed: int
    """Entries deleted."""
    dropped_unacked: int
    """Of those, how many some subscription had not acknowledged (only with
    ``drop_unacked=True``; otherwise always 0)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RetentionResult:
    """What one retention pass over a topic deleted, per partition."""

    topic: str
    partitions: tuple[PartitionTrim, ...]

    @property
    def trimmed(self) -> int:
        """Entries deleted over all partitions."""
        return sum(p.trimmed for p in self.partitions)

    @property
    def dropped_unacked(self) -> int:
        """Unacknowledged entries deleted over all partitions."""
        return sum(p.dropped_unacked for p in self.partitions)

    @classmethod
    def of(cls, topic: str, counts: Mapping[int, tuple[int, int]]) -> RetentionResult:
        """From per-partition (trimmed, dropped unacked) counts."""
        return cls(
            topic,
            tuple(PartitionTrim(p, t, d) for p, (t, d) in sorted(counts.items())),
        )
