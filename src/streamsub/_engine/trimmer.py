"""The retention trimmer: one pass over a topic, and the background loop.

A pass trims each partition by the topic's :class:`~streamsub.Retention` in
atomic server-side steps of at most ``TRIM_BATCH`` entries. The background
loop runs in every client for the topics it publishes to and the topics (and
dead-letter topics) of the subscriptions it subscribes to, every
``retention_interval`` seconds; a lock in Redis per topic (expiring after
``LOCK_TTL``) lets one client at a time do a topic's pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from .. import metrics
from .._backends.base import Backend, SnapshotRecord, TopicRecord
from .._core.retention import LOCK_TTL, TRIM_BATCH, RetentionResult, age_cutoff, floor_of
from .._errors import StreamsubError

__all__ = ["Trimmer", "enforce_retention", "live_snapshots"]

log = logging.getLogger("streamsub")


async def enforce_retention(
    backend: Backend,
    topic: TopicRecord,
    *,
    now: float,
    acked_trim: bool = False,
    batch: int = TRIM_BATCH,
    snapshots: Sequence[SnapshotRecord] = (),
) -> RetentionResult:
    """Trim every partition of ``topic`` by its retention as of ``now``, keeping
    what the live ``snapshots`` of the topic recorded."""
    retention = topic.retention
    counts: dict[int, tuple[int, int]] = dict.fromkeys(range(topic.partitions), (0, 0))
    if retention is None or not retention.bounded:
        return RetentionResult.of(topic.name, counts)
    cutoff = None if retention.max_age is None else age_cutoff(now, retention.max_age)
    live = [s for s in snapshots if s.topic == topic.name and s.expires > now]
    for partition in range(topic.partitions):
        floor = floor_of(
            (s.positions[partition].last_delivered_id, s.positions[partition].pending)
            for s in live
            if partition in s.positions
        )
        deleted = dropped = 0
        more = True
        while more:
            d, u, more = await backend.trim(
                topic,
                partition,
                cutoff=cutoff,
                max_length=retention.max_length,
                drop_unacked=retention.drop_unacked,
                batch=batch,
                acked_trim=acked_trim,
                floor=floor,
            )
            deleted, dropped = deleted + d, dropped + u
        counts[partition] = (deleted, dropped)
    result = RetentionResult.of(topic.name, counts)
    if result.trimmed:
        log.debug("streamsub: retention trimmed %d messages of %r", result.trimmed, topic.name)
    if result.dropped_unacked:
        metrics.on_dropped_unacked(topic.name, result.dropped_unacked)
        log.warning(
            "streamsub: retention of topic %r dropped %d unacknowledged messages "
            "(drop_unacked=True)",
            topic.name,
            result.dropped_unacked,
        )
    return result


async def live_snapshots(backend: Backend, now: float) -> list[SnapshotRecord]:
    """The snapshots that have not expired; expired ones are deleted on the way."""
    live = []
    for snapshot in await backend.list_snapshots():
        if snapshot.expires > now:
            live.append(snapshot)
        else:
            await backend.delete_snapshot(snapshot.name)
            log.info("streamsub: snapshot %r expired and was deleted", snapshot.name)
    return live


class Trimmer:
    """Runs retention passes in the background for the topics it watches."""

    def __init__(
        self,
        backend: Backend,
        *,
        interval: float,
        clock: Callable[[], float] = time.time,
        all_topics: bool = False,
    ) -> None:
        self._backend = backend
        self._all_topics = all_topics
        self._interval = interval
        self._clock = clock
        self._topics: set[str] = set()
        self._subscriptions: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._token = uuid.uuid4().hex
        self._acked_trim: bool | None = None
        self.passes = 0
        """Passes this trimmer finished (for tests and statistics)."""

    def watch_topic(self, name: str) -> None:
        """Keep ``name`` within its retention from now on."""
        self._topics.add(name)
        self._start()

    def watch_subscription(self, name: str) -> None:
        """Keep the subscription's topic and dead-letter topic within retention."""
        self._subscriptions.add(name)
        self._start()

    def _start(self) -> None:
        if self._task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside a loop: the next call starts it
                return
            self._task = loop.create_task(self._run())

    async def run_forever(self) -> None:
        """Run passes every interval until cancelled (what ``_start`` runs in a task)."""
        await self._run()

    async def aclose(self) -> None:
        """Stop the loop (a pass in progress is cut between two atomic steps)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except StreamsubError as exc:
                log.warning("streamsub: retention pass failed: %s; trying again later", exc)
            except Exception:  # a bug must not end trimming for the client's lifetime
                log.exception("streamsub: retention pass failed; trying again later")
            self.passes += 1
            await asyncio.sleep(self._interval)

    async def _names(self) -> set[str]:
        names = set(self._topics)
        if self._all_topics:
            names.update(t.name for t in await self._backend.list_topics())
        for name in list(self._subscriptions):
            record = await self._backend.get_subscription(name)
            if record is None:
                continue
            names.add(record.topic)
            dead_letter = record.settings.get("dead_letter_topic")
            if isinstance(dead_letter, str):
                names.add(dead_letter)
        return names

    async def run_once(self) -> dict[str, RetentionResult]:
        """One pass over every watched topic whose lock is free; return what it did."""
        if self._acked_trim is None:
            self._acked_trim = (await self._backend.server_info()).acked_trim
        results: dict[str, RetentionResult] = {}
        snapshots = await live_snapshots(self._backend, self._clock())
        for name in sorted(await self._names()):
            topic = await self._backend.get_topic(name)
            if topic is None or topic.retention is None or not topic.retention.bounded:
                continue
            lock = f"retention:{name}"
            if not await self._backend.try_lock(lock, self._token, LOCK_TTL):
                continue
            try:
                results[name] = await enforce_retention(
                    self._backend,
                    topic,
                    now=self._clock(),
                    acked_trim=self._acked_trim,
                    snapshots=snapshots,
                )
            finally:
                await self._backend.unlock(lock, self._token)
        return results
