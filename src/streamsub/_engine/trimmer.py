"""The retention trimmer: one pass over a topic, and the background loop.

A pass trims each partition by the topic's :class:`~streamsub.Retention` in
atomic server-side steps of at most ``TRIM_BATCH`` entries. The background
loop runs in every client for the topics it publishes to and the topics (and
dead-letter topics) of the subscriptions it subscribes to, every
``retention_interval`` seconds; a lock in Redis per topic (expiring after
``LOCK_TTL``, extended after every step) lets one client at a time do a
topic's pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

from .. import metrics
from .._backends.base import Backend, SnapshotRecord, TopicRecord
from .._core.retention import LOCK_TTL, TRIM_BATCH, RetentionResult, floor_of
from .._errors import StreamsubError
from ._retrying import raise_if_cancelled

__all__ = ["Trimmer", "enforce_retention", "is_dead_letter_topic", "live_snapshots"]

log = logging.getLogger("streamsub")


async def enforce_retention(
    backend: Backend,
    topic: TopicRecord,
    *,
    now: float,
    acked_trim: bool = False,
    batch: int = TRIM_BATCH,
    snapshots: Sequence[SnapshotRecord] = (),
    dead_letters: bool = False,
    renew: Callable[[], Awaitable[bool]] | None = None,
) -> RetentionResult:
    """Trim every partition of ``topic`` by its retention, keeping what the live
    ``snapshots`` of the topic recorded (``now``: the server's time, for their
    expiry; ages are judged by the server's clock in the trim step itself).

    ``dead_letters``: the topic is a dead-letter topic, so entries deleted while
    no subscription reads it are unresolved dead letters, counted like
    ``drop_unacked`` drops. ``renew`` is called after every step to extend the
    caller's lock; when it answers False the lock was lost and the pass stops.
    What was dropped is reported (metric and warning) even when a step fails.
    """
    retention = topic.retention
    counts: dict[int, tuple[int, int]] = dict.fromkeys(range(topic.partitions), (0, 0))
    if retention is None or not retention.bounded:
        return RetentionResult.of(topic.name, counts)
    live = [s for s in snapshots if s.topic == topic.name and s.expires > now]
    try:
        for partition in range(topic.partitions):
            floor = floor_of(
                (s.positions[partition].last_delivered_id, s.positions[partition].pending)
                for s in live
                if partition in s.positions
            )
            more = True
            while more:
                d, u, more = await backend.trim(
                    topic,
                    partition,
                    max_age=retention.max_age,
                    max_length=retention.max_length,
                    drop_unacked=retention.drop_unacked,
                    batch=batch,
                    acked_trim=acked_trim,
                    floor=floor,
                    dead_letters=dead_letters,
                )
                deleted, dropped = counts[partition]
                counts[partition] = (deleted + d, dropped + u)
                if renew is not None and not await renew():
                    log.warning(
                        "streamsub: lost the retention lock of topic %r during a pass; "
                        "stopping it (another trimmer goes on)",
                        topic.name,
                    )
                    return RetentionResult.of(topic.name, counts)
    finally:
        _report(RetentionResult.of(topic.name, counts), dead_letters=dead_letters)
    return RetentionResult.of(topic.name, counts)


def _report(result: RetentionResult, *, dead_letters: bool) -> None:
    """Log and count what a pass (or the part of it that ran) deleted."""
    if result.trimmed:
        log.debug("streamsub: retention trimmed %d messages of %r", result.trimmed, result.topic)
    if not result.dropped_unacked:
        return
    metrics.on_dropped_unacked(result.topic, result.dropped_unacked)
    if dead_letters:
        log.warning(
            "streamsub: retention of dead-letter topic %r deleted %d unresolved dead "
            "letters (counted as dropped_unacked)",
            result.topic,
            result.dropped_unacked,
        )
    else:
        log.warning(
            "streamsub: retention of topic %r dropped %d unacknowledged messages "
            "(drop_unacked=True)",
            result.topic,
            result.dropped_unacked,
        )


async def is_dead_letter_topic(backend: Backend, name: str) -> bool:
    """Whether some subscription dead-letters into topic ``name``."""
    return any(
        s.settings.get("dead_letter_topic") == name for s in await backend.list_subscriptions()
    )


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
        all_topics: bool = False,
    ) -> None:
        self._backend = backend
        self._all_topics = all_topics
        self._interval = interval
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
                raise_if_cancelled()
                log.warning("streamsub: retention pass failed: %s; trying again later", exc)
            except Exception:  # a bug must not end trimming for the client's lifetime
                raise_if_cancelled()
                log.exception("streamsub: retention pass failed; trying again later")
            self.passes += 1
            raise_if_cancelled()  # a stop request swallowed inside a Redis call
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
        now = await self._backend.server_time()
        snapshots = await live_snapshots(self._backend, now)
        dead_letter_topics = {
            name
            for s in await self._backend.list_subscriptions()
            if isinstance(name := s.settings.get("dead_letter_topic"), str)
        }
        for name in sorted(await self._names()):
            topic = await self._backend.get_topic(name)
            if topic is None or topic.retention is None or not topic.retention.bounded:
                continue
            lock = f"retention:{name}"
            if not await self._backend.try_lock(lock, self._token, LOCK_TTL):
                continue

            async def renew(lock: str = lock) -> bool:
                return await self._backend.extend_lock(lock, self._token, LOCK_TTL)

            try:
                results[name] = await enforce_retention(
                    self._backend,
                    topic,
                    now=now,
                    acked_trim=self._acked_trim,
                    snapshots=snapshots,
                    dead_letters=name in dead_letter_topics,
                    renew=renew,
                )
            finally:
                await self._backend.unlock(lock, self._token)
        return results
