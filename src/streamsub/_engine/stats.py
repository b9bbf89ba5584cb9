"""Statistics for operators: read every partition once, report per topic and subscription."""

from __future__ import annotations

import datetime

from .._backends.base import Backend, SubscriptionRecord, TopicRecord
from .._core.stats import (
    ATTEMPT_SAMPLE,
    BACKLOG_CAP,
    RATE_SAMPLE,
    RATE_WINDOW,
    PartitionCounts,
    Stats,
    SubscriptionReport,
    TopicReport,
    subscription_report,
    topic_report,
)

__all__ = ["collect_stats"]


async def _counts(backend: Backend, topic: TopicRecord) -> list[PartitionCounts]:
    return await backend.partition_counts(
        topic,
        window=RATE_WINDOW,
        rate_sample=RATE_SAMPLE,
        sample=ATTEMPT_SAMPLE,
        backlog_cap=BACKLOG_CAP,
    )


async def collect_stats(
    backend: Backend,
    topics: list[TopicRecord],
    subscriptions: list[SubscriptionRecord],
    *,
    now: float,
) -> Stats:
    """Reports for ``topics`` and ``subscriptions`` (whose topics must be among
    ``topics``), as of ``now``; dead-letter topics are read for their length."""
    counts = {t.name: await _counts(backend, t) for t in topics}
    topic_reports: list[TopicReport] = []
    for t in topics:
        dropped = await backend.dropped_unacked(t)
        topic_reports.append(
            topic_report(
                t.name, counts[t.name], dropped_unacked=sum(dropped.values()), retention=t.retention
            )
        )
    lengths = {r.topic: r.length for r in topic_reports}
    reports: list[SubscriptionReport] = []
    for s in subscriptions:
        dead_letter = s.settings.get("dead_letter_topic")
        depth = None
        if isinstance(dead_letter, str):
            if dead_letter not in lengths:
                record = await backend.get_topic(dead_letter)
                lengths[dead_letter] = (
                    0 if record is None else sum(c.length for c in await _counts(backend, record))
                )
            depth = lengths[dead_letter]
        reports.append(
            subscription_report(
                s.name, s.topic, counts.get(s.topic, []), now=now, dead_letter_topic_length=depth
            )
        )
    return Stats(
        taken=datetime.datetime.fromtimestamp(now, tz=datetime.UTC),
        topics=tuple(topic_reports),
        subscriptions=tuple(reports),
    )
