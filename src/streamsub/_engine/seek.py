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
from .._errors import AlreadyExistsError

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
    backend: Backend, name: str, topic: TopicRecord, subscription: str
) -> SnapshotRecord:
    """Record ``subscription``'s position and pending ids on every partition as
    ``name``; each partition's read and its retention hold are one atomic step,
    so no trim can remove what the snapshot needs in between. Created and
    expiry times are the server's."""
    existing = await backend.get_snapshot(name)
    if existing is not None:
        if existing.expires > await backend.server_time():
            raise AlreadyExistsError(
                f"snapshot {name!r} exists: delete it first or use another name"
            )
        await backend.delete_snapshot(name)
    positions, created, expires = await backend.hold_positions(
        topic, subscription, name, SNAPSHOT_LIFETIME, MAX_SNAPSHOT_PENDING
    )
    record = SnapshotRecord(name, subscription, topic.name, created, positions, expires)
    try:
        stored = await backend.create_snapshot(record)
    except BaseException:
        await backend.release_holds(topic, name)
        raise
    if not stored:  # written meanwhile by a creator that holds nothing (older version)
        await backend.release_holds(topic, name)
        raise AlreadyExistsError(f"snapshot {name!r} exists: delete it first or use another name")
    return record
