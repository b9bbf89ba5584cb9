"""Seek and snapshots: move a subscription on every partition, or record where it is.

The plan per partition comes from ``_core.seek``; each partition is one atomic
server-side step. Partitions move one after another, so a subscriber running
meanwhile may see some partitions moved before others (as with Pub/Sub, a
seek is eventually consistent for running subscribers).
"""

from __future__ import annotations

import logging

from .._backends.base import Backend, SnapshotRecord, TopicRecord
from .._core.seek import MAX_SNAPSHOT_PENDING, SNAPSHOT_LIFETIME, SeekResult, plan_seek
from .._errors import AlreadyExistsError, FailedPreconditionError

__all__ = ["SEEK_CONSUMER", "seek", "take_snapshot"]

SEEK_CONSUMER = "streamsub-seek"
"""The consumer that holds, for a moment, what a snapshot seek delivers again;
reclaimers take it from there, and the idle-consumer sweep deletes it."""

log = logging.getLogger("streamsub")


async def seek(
    backend: Backend,
    topic: TopicRecord,
    subscription: str,
    to: object,
    snapshot: SnapshotRecord | None = None,
) -> SeekResult:
    """Seek ``subscription`` (on ``topic``) to ``to`` on every partition."""
    plans = plan_seek(to, topic.partitions, None if snapshot is None else snapshot.positions)
    acked = restored = 0
    for partition, plan in sorted(plans.items()):
        a, r = await backend.seek_partition(topic, subscription, partition, plan, SEEK_CONSUMER)
        acked, restored = acked + a, restored + r
    log.info(
        "streamsub: subscription %r sought to %s: %d pending acknowledged, %d made pending again",
        subscription,
        to,
        acked,
        restored,
    )
    return SeekResult(subscription, acked, restored)


async def take_snapshot(
    backend: Backend, name: str, topic: TopicRecord, subscription: str, now: float
) -> SnapshotRecord:
    """Record ``subscription``'s position and pending ids on every partition as ``name``."""
    positions = await backend.group_positions(topic, subscription, MAX_SNAPSHOT_PENDING)
    for partition, position in positions.items():
        if len(position.pending) > MAX_SNAPSHOT_PENDING:
            raise FailedPreconditionError(
                f"subscription {subscription!r} has more than {MAX_SNAPSHOT_PENDING} pending "
                f"messages on partition {partition}: a snapshot records at most that many; "
                "let subscribers catch up first"
            )
    record = SnapshotRecord(name, subscription, topic.name, now, positions, now + SNAPSHOT_LIFETIME)
    if not await backend.create_snapshot(record):
        raise AlreadyExistsError(f"snapshot {name!r} exists: delete it first or use another name")
    return record
