"""Stats reports summed from per-partition counts, on plain values and a given now."""

from __future__ import annotations

import pytest

from streamsub import Retention
from streamsub._core.stats import (
    RATE_WINDOW,
    GroupCounts,
    PartitionCounts,
    subscription_report,
    topic_report,
)


def _group(name: str, **overrides: object) -> GroupCounts:
    values: dict[str, object] = {
        "name": name,
        "pending": 0,
        "last_delivered_id": "0-0",
        "backlog": 0,
        "first_pending_id": None,
        "first_undelivered_id": None,
        "consumers": {},
        "attempts": [],
    }
    values.update(overrides)
    return GroupCounts(**values)  # type: ignore[arg-type]


COUNTS = [
    PartitionCounts(
        0,
        length=100,
        memory=5000,
        recent=30,
        groups=[
            _group(
                "billing",
                pending=3,
                backlog=10,
                first_pending_id="1000000-0",
                first_undelivered_id="1005000-0",
                consumers={"a": 2, "b": 1},
                attempts=[1, 1, 4],
            ),
            _group("audit", backlog=100, first_undelivered_id="900000-0"),
        ],
    ),
    PartitionCounts(
        1,
        length=50,
        memory=3000,
        recent=20,
        groups=[
            _group(
                "billing",
                pending=1,
                backlog=0,
                first_pending_id="1008000-3",
                consumers={"a": 1},
                attempts=[2],
            ),
            _group("audit", backlog=50, first_undelivered_id="950000-0"),
        ],
    ),
]


def test_topic_report_sums_partitions() -> None:
    """A topic's length, memory and publish rate are the sums over its partitions."""
    policy = Retention(max_length=10)
    report = topic_report("orders", COUNTS, dropped_unacked=7, retention=policy)
    assert (report.partitions, report.length, report.lengths) == (2, 150, (100, 50))
    assert report.memory_bytes == 8000
    assert report.publish_rate == pytest.approx(50 / RATE_WINDOW)
    assert (report.dropped_unacked, report.retention) == (7, policy)


def test_topic_memory_is_unknown_when_a_partition_is() -> None:
    """One partition without a memory figure makes the topic's memory unknown."""
    counts = [COUNTS[0], PartitionCounts(1, 50, None, 0, [])]
    assert topic_report("orders", counts, dropped_unacked=0, retention=None).memory_bytes is None


def test_subscription_report_sums_one_group() -> None:
    """A subscription's backlog, pending, consumers and attempts are summed over its
    partitions; its oldest unacknowledged age is the oldest of first pending and
    first undelivered, as of now."""
    report = subscription_report(
        "billing", "orders", COUNTS, now=1010.0, dead_letter_topic_length=4
    )
    assert (report.backlog, report.pending) == (10, 4)
    assert [(p.partition, p.backlog, p.pending) for p in report.partitions] == [
        (0, 10, 3),
        (1, 0, 1),
    ]
    assert [p.oldest_unacked_age for p in report.partitions] == [10.0, 2.0]
    assert report.oldest_unacked_age == 10.0
    assert report.pending_per_consumer == {"a": 3, "b": 1}
    assert report.delivery_attempts == {1: 2, 2: 1, 4: 1}
    assert report.dead_letter_topic_length == report.dead_letters == 4


def test_a_caught_up_subscription_has_no_oldest_age() -> None:
    """With nothing pending or undelivered, the oldest unacknowledged age is None."""
    counts = [PartitionCounts(0, 10, 1, 0, [_group("billing", last_delivered_id="5-0")])]
    report = subscription_report(
        "billing", "orders", counts, now=10.0, dead_letter_topic_length=None
    )
    assert (report.backlog, report.pending, report.oldest_unacked_age) == (0, 0, None)
    assert report.dead_letter_topic_length is None
